-- The seed report's per-run table: step latency, long steps and GC per run.

-- One row per run that has steps or GC passes.
CREATE OR REPLACE VIEW seed_runs AS
WITH s AS (     -- percentiles and long steps over non-idle steps only
    SELECT a.run_id,
        count(*) AS steps,
        count(*) FILTER (a.idle) AS idle_steps,
        avg(a.duration_ns) FILTER (NOT a.idle) AS mean_ns,
        quantile_cont(a.duration_ns, 0.5) FILTER (NOT a.idle) AS p50_ns,
        quantile_cont(a.duration_ns, 0.99) FILTER (NOT a.idle) AS p99_ns,
        max(a.duration_ns) FILTER (NOT a.idle) AS max_ns,
        count(*) FILTER (NOT a.idle AND a.duration_ns > p.long_step_ns) AS long_steps,
        count(*) FILTER (NOT a.idle AND a.duration_ns > p.long_step_ns AND a.stage IS DISTINCT FROM p.prefill_stage) AS long_non_prefill,
        count(*) FILTER (NOT a.idle AND a.duration_ns > p.long_step_ns AND a.stage IS DISTINCT FROM p.prefill_stage AND a.gc_ns = 0) AS long_non_prefill_no_gc,
        count(*) FILTER (a.slow) AS slow_steps,
        count(*) FILTER (a.cause = 'unexplained') AS unexplained_steps
    FROM step_attribution a CROSS JOIN step_params p GROUP BY a.run_id
), g AS (
    SELECT run_id,
        count(*) FILTER (generation = 0) AS gen0_count,
        sum(end_ns - start_ns) FILTER (generation = 0) AS gen0_ns,
        max(end_ns - start_ns) FILTER (generation = 0) AS gen0_max_ns,
        count(*) FILTER (generation = 1) AS gen1_count,
        sum(end_ns - start_ns) FILTER (generation = 1) AS gen1_ns,
        max(end_ns - start_ns) FILTER (generation = 1) AS gen1_max_ns,
        count(*) FILTER (generation = 2) AS gen2_count,
        sum(end_ns - start_ns) FILTER (generation = 2) AS gen2_ns,
        max(end_ns - start_ns) FILTER (generation = 2) AS gen2_max_ns
    FROM gc_events GROUP BY run_id
)
SELECT
    run_id,                                           -- run
    r.label,                                          -- run label
    coalesce(s.steps, 0) AS steps,                    -- engine steps (idle ones included)
    round(s.mean_ns / 1e6, 3) AS mean_step_ms,        -- mean non-idle step duration, ms
    round(s.p50_ns / 1e6, 3) AS p50_step_ms,          -- median non-idle step duration, ms
    round(s.p99_ns / 1e6, 3) AS p99_step_ms,          -- 99th percentile non-idle step duration, ms
    round(s.max_ns / 1e6, 3) AS max_step_ms,          -- longest non-idle step, ms
    coalesce(s.long_steps, 0) AS long_steps,          -- non-idle steps longer than step_params.long_step_ns (100 ms)
    coalesce(s.long_non_prefill, 0) AS long_non_prefill,             -- of which not prefill (step_params.prefill_stage)
    coalesce(s.long_non_prefill_no_gc, 0) AS long_non_prefill_no_gc, -- of which overlapping no GC pass
    coalesce(s.slow_steps, 0) AS slow_steps,          -- steps > slow_factor x baseline
    coalesce(g.gen0_count, 0) AS gen0_count,          -- generation-0 passes
    round(coalesce(g.gen0_ns, 0) / 1e6, 3) AS gen0_pause_ms,     -- their total pause, ms
    round(g.gen0_max_ns / 1e6, 3) AS gen0_max_ms,                -- their longest pause, ms
    coalesce(g.gen1_count, 0) AS gen1_count,          -- generation-1 passes
    round(coalesce(g.gen1_ns, 0) / 1e6, 3) AS gen1_pause_ms,     -- their total pause, ms
    round(g.gen1_max_ns / 1e6, 3) AS gen1_max_ms,                -- their longest pause, ms
    coalesce(g.gen2_count, 0) AS gen2_count,          -- generation-2 passes
    round(coalesce(g.gen2_ns, 0) / 1e6, 3) AS gen2_pause_ms,     -- their total pause, ms
    round(g.gen2_max_ns / 1e6, 3) AS gen2_max_ms,                -- their longest pause, ms
    coalesce(s.idle_steps, 0) AS idle_steps,          -- idle steps (never slow or long; out of the percentiles)
    coalesce(s.unexplained_steps, 0) AS unexplained_steps, -- slow steps whose cause is 'unexplained'
    r.gc_freeze_after_s,                              -- knob applied: gc.collect() + gc.freeze() this many s after connect (NULL: none)
    r.gc_threshold_set                                -- knob applied: gc.set_threshold(...) at connect (NULL: none); with the previous column, the run's A/B arm
FROM s FULL JOIN g USING (run_id)
LEFT JOIN runs r USING (run_id);
