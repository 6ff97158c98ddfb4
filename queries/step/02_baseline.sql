-- Step baselines: what a normal step of a given shape costs in a run.
--
-- The model (parameters in step_params):
--   Idle steps (see _step) are left out of every baseline and get none.
--   Without a work measure, a step's baseline is the median duration of the
--   run's non-idle steps with the same stage and batch size (the seed's
--   rule), if that group holds at least baseline_min_steps (5) steps; a
--   smaller group falls back to the median of the run's non-idle steps with
--   the same stage, whatever their batch (baseline_model 'batch' or 'stage').
--   The median keeps the slow steps under study from moving their baseline.
--   With a work measure (spans.work, attach(work=...): tokens of context,
--   KV blocks, ...), a step is compared with steps of similar work instead
--   of the same batch size: work is cut into buckets of
--   1/work_buckets_per_octave of a doubling (floor(log2(1 + work) x 4): each
--   about 19% wide) and the baseline is the median duration of the run's
--   non-idle steps with the same stage and work bucket, if the bucket holds
--   at least baseline_min_steps steps ('work_bucket'); else Tukey's
--   resistant line fitted per run and stage on (work, duration), evaluated
--   at the step's work ('work_fit': slope from the medians of the lowest and
--   highest third of the steps by work, intercept the median residual; a
--   handful of slow steps cannot move it), if the stage has at least
--   baseline_min_steps steps with work and its thirds differ in work; else
--   the batch rule above. The fitted value is at least 1 ns.

-- Per non-idle step and idle step alike: its baseline and the model that gave it.
CREATE OR REPLACE VIEW _step_base AS
WITH f AS MATERIALIZED (SELECT * FROM _step_frame),
p AS (SELECT * FROM step_params),
gb AS (     -- run, stage, batch
    SELECT run_id, stage, batch, count(*) AS n, median(duration_ns) AS med,
           median(submit_ns) AS submit_med
    FROM f WHERE NOT idle GROUP BY ALL
), gs AS (  -- run, stage
    SELECT run_id, stage, median(duration_ns) AS med FROM f WHERE NOT idle GROUP BY ALL
), fw AS (  -- non-idle steps with a work measure, and their work bucket
    SELECT f.run_id, f.stage, f.work, f.duration_ns,
           floor(log2(1 + f.work) * p.work_buckets_per_octave)::BIGINT AS wb
    FROM f, p WHERE NOT f.idle AND f.work >= 0
), gw AS (
    SELECT run_id, stage, wb, count(*) AS n, median(duration_ns) AS med FROM fw GROUP BY ALL
), thirds AS (
    SELECT run_id, stage, work, duration_ns,
           ntile(3) OVER (PARTITION BY run_id, stage ORDER BY work) AS third
    FROM fw
), tl AS (
    SELECT run_id, stage, count(*) AS n,
           median(work) FILTER (third = 1) AS xl, median(duration_ns) FILTER (third = 1) AS yl,
           median(work) FILTER (third = 3) AS xr, median(duration_ns) FILTER (third = 3) AS yr
    FROM thirds GROUP BY ALL
), line AS (
    SELECT tl.run_id, tl.stage, (tl.yr - tl.yl) / (tl.xr - tl.xl) AS slope
    FROM tl, p WHERE tl.xr > tl.xl AND tl.n >= p.baseline_min_steps
), fit AS (
    SELECT l.run_id, l.stage, l.slope, median(fw.duration_ns - l.slope * fw.work) AS intercept
    FROM fw JOIN line l ON l.run_id = fw.run_id AND l.stage IS NOT DISTINCT FROM fw.stage
    GROUP BY ALL
), b AS (
    SELECT f.*,
        CASE WHEN gb.n >= p.baseline_min_steps THEN gb.med ELSE gs.med END AS batch_med,
        CASE WHEN gb.n >= p.baseline_min_steps THEN 'batch' ELSE 'stage' END AS batch_model,
        gw.n AS work_n, gw.med AS work_med,
        greatest(fit.intercept + fit.slope * f.work, 1) AS fit_ns,
        gb.submit_med,
        p.baseline_min_steps
    FROM f CROSS JOIN p
    LEFT JOIN gb ON gb.run_id = f.run_id AND gb.stage IS NOT DISTINCT FROM f.stage AND gb.batch = f.batch
    LEFT JOIN gs ON gs.run_id = f.run_id AND gs.stage IS NOT DISTINCT FROM f.stage
    LEFT JOIN gw ON gw.run_id = f.run_id AND gw.stage IS NOT DISTINCT FROM f.stage
               AND gw.wb = floor(log2(1 + f.work) * p.work_buckets_per_octave)::BIGINT
    LEFT JOIN fit ON fit.run_id = f.run_id AND fit.stage IS NOT DISTINCT FROM f.stage
)
SELECT b.* EXCLUDE (batch_med, batch_model, work_n, work_med, fit_ns, submit_med, baseline_min_steps),
    CASE WHEN idle THEN NULL
         WHEN work_n >= baseline_min_steps THEN round(work_med)
         WHEN fit_ns IS NOT NULL AND work >= 0 THEN round(fit_ns)
         ELSE round(batch_med) END::BIGINT AS baseline_ns,
    CASE WHEN idle THEN NULL
         WHEN work_n >= baseline_min_steps THEN 'work_bucket'
         WHEN fit_ns IS NOT NULL AND work >= 0 THEN 'work_fit'
         ELSE batch_model END AS baseline_model,
    CASE WHEN NOT idle THEN round(batch_med)::BIGINT END AS batch_baseline_ns,
    CASE WHEN NOT idle THEN batch_model END AS batch_baseline_model,
    round(submit_med)::BIGINT AS submit_baseline_ns
FROM b;

-- One row per run, stage and batch size: the batch rule's baseline of the
-- group (steps with a work measure may use a work baseline instead: see
-- step_attribution.baseline_model and step_work_baseline).
CREATE OR REPLACE VIEW step_baseline AS
SELECT
    run_id,                                               -- run
    stage,                                                -- stage (NULL groups steps without one)
    batch,                                                -- batch size, 0 if unknown
    count(*) FILTER (NOT idle) AS steps,                  -- non-idle steps in the group
    any_value(batch_baseline_ns) AS baseline_ns,          -- the group's median step duration, or its stage's when the group is small; NULL for idle steps only, ns
    count(*) FILTER (idle) AS idle_steps,                 -- idle steps in the group (batch 0 or marked idle)
    any_value(batch_baseline_model) AS baseline_model     -- 'batch' (the group's median) or 'stage' (group under baseline_min_steps: the stage's median)
FROM _step_base
GROUP BY run_id, stage, batch;

-- One row per run and stage with a work measure: the resistant line that
-- step_attribution falls back to for sparse work buckets.
CREATE OR REPLACE VIEW step_work_baseline AS
WITH fw AS (
    SELECT run_id, stage, work, duration_ns,
           ntile(3) OVER (PARTITION BY run_id, stage ORDER BY work) AS third
    FROM _step WHERE NOT idle AND work >= 0
), tl AS (
    SELECT run_id, stage, count(*) AS n,
           median(work) FILTER (third = 1) AS xl, median(duration_ns) FILTER (third = 1) AS yl,
           median(work) FILTER (third = 3) AS xr, median(duration_ns) FILTER (third = 3) AS yr
    FROM fw GROUP BY ALL
), l AS (
    SELECT run_id, stage, n, CASE WHEN xr > xl THEN (yr - yl) / (xr - xl) END AS slope FROM tl
)
SELECT
    l.run_id,                                             -- run
    l.stage,                                              -- stage
    l.n AS steps,                                         -- non-idle steps with a work measure
    round(l.slope, 3) AS slope_ns_per_work,               -- ns of step time per unit of work (NULL: thirds equal in work)
    round(median(fw.duration_ns - l.slope * fw.work))::BIGINT AS intercept_ns, -- ns at work 0 (median residual)
    l.n >= p.baseline_min_steps AND l.slope IS NOT NULL AS used  -- whether step_attribution may use the line
FROM l CROSS JOIN step_params p
JOIN fw ON fw.run_id = l.run_id AND fw.stage IS NOT DISTINCT FROM l.stage
GROUP BY l.run_id, l.stage, l.n, l.slope, p.baseline_min_steps;
