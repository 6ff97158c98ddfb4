-- Step attribution: for every step, what took its time, and for slow steps
-- the cause.
--
-- Rules (parameters in step_params; SET VARIABLE to change them):
--   slow        duration_ns > slow_factor (1.2) x baseline_ns, where the
--               baseline is the median of the run's steps with the same stage
--               and batch (step_baseline).
--   excess_ns   duration_ns - baseline_ns (negative for fast steps).
--   components  the time each candidate cause took inside the step, ns:
--                 gc          GC passes overlapping the step (any thread of the run)
--                 preemption  off-CPU time after involuntary switch-outs
--                 blocked     off-CPU time after voluntary switch-outs
--                 migration   migrations inside the step x migration_cost_ns
--                             (50 us): a migration has no duration of its own;
--                             the wait around it is already preemption or
--                             blocked time, so only many migrations name it
--                 gpu_clock   step time under an SM clock below
--                             gpu_clock_factor (0.9) x the run's reference
--                             clock while the GPU was not idle
--                 submit      submit_excess_ns less the GC and off-CPU time
--                             inside the submit calls (host work of submit
--                             itself, not a pause that happened in it)
--   cause       NULL unless slow; else the largest component, if it is > 0
--               and at least cause_min_share (0.5) x excess_ns; else
--               'unexplained'. Ties go to the first of gc, preemption,
--               blocked, migration, gpu_clock, submit (the more specific).
--               A step that no GC pass overlapped has gc_ns = 0 and is never
--               'gc'. With empty offcpu/runq/migrations/nvml_samples tables
--               those components are 0 and never named.

-- One row per step.
CREATE OR REPLACE VIEW step_attribution AS
WITH f AS (
    -- the baselines of step_baseline and step_submit, computed here as window
    -- aggregates so the steps are read once (same medians, same rounding)
    SELECT fr.*,
        round(median(fr.duration_ns) OVER g)::BIGINT AS baseline_ns,
        round(median(fr.submit_ns) OVER g)::BIGINT AS submit_baseline_ns
    FROM _step_frame fr
    WINDOW g AS (PARTITION BY fr.run_id, fr.stage, fr.batch)
), j AS (
    SELECT
        f.run_id, f.tid, f.step_idx, f.stage, f.batch, f.start_ns, f.end_ns, f.duration_ns,
        f.baseline_ns,
        f.duration_ns - f.baseline_ns AS excess_ns,
        coalesce(c.gc_ns, 0) AS gc_ns,
        c.gc_generation,
        coalesce(c.preempted_ns, 0) AS preempted_ns,
        coalesce(c.blocked_ns, 0) AS blocked_ns,
        coalesce(c.runq_ns, 0) AS runq_ns,
        coalesce(c.migrations, 0) AS migrations,
        f.submit_ns,
        coalesce(greatest(f.submit_ns - f.submit_baseline_ns, 0), 0) AS submit_excess_ns,
        gp.sm_clock_min_mhz,
        gp.clock_event_reasons,
        coalesce(gp.gpu_clock_ns, 0) AS gpu_clock_ns,
        coalesce(c.migrations, 0) * p.migration_cost_ns AS migration_ns,
        greatest(coalesce(greatest(f.submit_ns - f.submit_baseline_ns, 0), 0)
                 - coalesce(c.gc_in_submit_ns, 0) - coalesce(c.offcpu_in_submit_ns, 0), 0) AS submit_host_ns,
        f.duration_ns > p.slow_factor * f.baseline_ns AS slow,
        p.cause_min_share
    FROM f
    CROSS JOIN step_params p
    LEFT JOIN _step_components c ON c.run_id = f.run_id AND c.tid = f.tid AND c.step_idx = f.step_idx
    LEFT JOIN step_gpu gp ON gp.run_id = f.run_id AND gp.tid = f.tid AND gp.step_idx = f.step_idx
), m AS (
    SELECT j.*, greatest(gc_ns, preempted_ns, blocked_ns, migration_ns, gpu_clock_ns, submit_host_ns) AS top_ns
    FROM j
)
SELECT
    run_id,               -- run (runs.run_id)
    tid,                  -- native thread id of the step
    step_idx,             -- index of the step on its thread, 0-based, in start order
    stage,                -- step's stage, or NULL
    batch,                -- step's batch size, 0 if unknown
    start_ns,             -- CLOCK_MONOTONIC ns
    end_ns,               -- CLOCK_MONOTONIC ns
    duration_ns,          -- end_ns - start_ns, ns
    baseline_ns,          -- median duration of the run's steps with this stage and batch, ns
    excess_ns,            -- duration_ns - baseline_ns, ns (negative when faster)
    gc_ns,                -- GC time inside the step, ns
    gc_generation,        -- generation of the GC pass with the most time in the step, NULL if none
    preempted_ns,         -- off-CPU time after involuntary switch-outs, ns
    blocked_ns,           -- off-CPU time after voluntary switch-outs, ns
    runq_ns,              -- run-queue wait, ns (part of the two above)
    migrations,           -- CPU migrations inside the step
    submit_ns,            -- host time inside submit calls, ns (NULL when none)
    submit_excess_ns,     -- submit_ns above its baseline (step_submit), ns, >= 0
    sm_clock_min_mhz,     -- lowest SM clock during the step, MHz (NULL without NVML samples)
    clock_event_reasons,  -- OR of NVML clock-event reasons during the step (NULL without samples)
    gpu_clock_ns,         -- step time under a dropped SM clock, ns
    migration_ns,         -- migrations x migration_cost_ns: the migration component, ns
    submit_host_ns,       -- submit component: submit_excess_ns less GC and off-CPU time inside submit, ns
    slow,                 -- duration_ns > slow_factor x baseline_ns
    CASE
        WHEN NOT slow THEN NULL
        WHEN top_ns > 0 AND top_ns >= cause_min_share * excess_ns THEN
            CASE top_ns
                WHEN gc_ns THEN 'gc'
                WHEN preempted_ns THEN 'preemption'
                WHEN blocked_ns THEN 'blocked'
                WHEN migration_ns THEN 'migration'
                WHEN gpu_clock_ns THEN 'gpu_clock'
                ELSE 'submit'
            END
        ELSE 'unexplained'
    END AS cause,         -- NULL (not slow), gc, preemption, blocked, migration, gpu_clock, submit or unexplained
    CASE WHEN slow THEN top_ns END AS cause_ns  -- slow steps: size of the largest component, ns
FROM m;
