-- The seed report's slow-step breakdown: how many steps of each stage and
-- batch size are slow (step_attribution.slow), how much of their excess lies
-- inside submit, and what step_attribution names as the cause.

-- One row per run, stage and batch size. Sums and counts, so rows of
-- several runs add up (the report does that).
CREATE OR REPLACE VIEW seed_slow_steps AS
WITH a AS (
    SELECT run_id, stage, batch,
        count(*) AS steps,
        count(*) FILTER (slow) AS slow_steps,
        coalesce(sum(excess_ns) FILTER (slow), 0)::BIGINT AS excess_ns,
        coalesce(sum(least(submit_excess_ns, excess_ns)) FILTER (slow), 0)::BIGINT AS submit_excess_ns,
        count(*) FILTER (cause = 'gc') AS cause_gc,
        count(*) FILTER (cause = 'preemption') AS cause_preemption,
        count(*) FILTER (cause = 'blocked') AS cause_blocked,
        count(*) FILTER (cause = 'migration') AS cause_migration,
        count(*) FILTER (cause = 'gpu_clock') AS cause_gpu_clock,
        count(*) FILTER (cause = 'submit') AS cause_submit,
        count(*) FILTER (cause = 'unexplained') AS cause_unexplained
    FROM step_attribution
    GROUP BY run_id, stage, batch
)
SELECT
    run_id,                                              -- run
    stage,                                               -- stage
    batch,                                               -- batch size
    steps,                                               -- steps
    slow_steps,                                          -- slow steps (step_attribution.slow)
    round(slow_steps / steps, 4) AS slow_share,          -- slow_steps / steps, 0..1
    excess_ns,                                           -- total excess of the slow steps, ns
    submit_excess_ns,                                    -- of which inside submit (per step at most its excess), ns
    round(submit_excess_ns / nullif(excess_ns, 0), 4) AS submit_share, -- submit_excess_ns / excess_ns, 0..1
    CASE greatest(cause_gc, cause_preemption, cause_blocked, cause_migration,
                  cause_gpu_clock, cause_submit, cause_unexplained)
        WHEN 0 THEN NULL
        WHEN cause_gc THEN 'gc'
        WHEN cause_preemption THEN 'preemption'
        WHEN cause_blocked THEN 'blocked'
        WHEN cause_migration THEN 'migration'
        WHEN cause_gpu_clock THEN 'gpu_clock'
        WHEN cause_submit THEN 'submit'
        ELSE 'unexplained'
    END AS top_cause,        -- most frequent cause among the slow steps (ties: the order of this list)
    cause_gc,                -- slow steps whose cause is gc
    cause_preemption,        -- ... preemption
    cause_blocked,           -- ... blocked
    cause_migration,         -- ... migration
    cause_gpu_clock,         -- ... gpu_clock
    cause_submit,            -- ... submit
    cause_unexplained        -- ... unexplained
FROM a;
