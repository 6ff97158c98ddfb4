-- The seed report's slow-step breakdown: how many steps of each stage and
-- batch size are slow (step_attribution.slow), how much of their excess lies
-- inside submit, and what step_attribution names as the cause.

-- One row per run, stage and batch size. Sums and counts, so rows of
-- several runs add up (the report does that). The cause_* columns of the
-- first release come first, the later causes after them.
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
        count(*) FILTER (cause = 'unexplained') AS cause_unexplained,
        count(*) FILTER (cause = 'lock') AS cause_lock,
        count(*) FILTER (cause = 'peer') AS cause_peer,
        count(*) FILTER (cause = 'runqueue') AS cause_runqueue,
        count(*) FILTER (cause = 'throttled') AS cause_throttled,
        count(*) FILTER (cause = 'irq') AS cause_irq,
        count(*) FILTER (cause = 'steal') AS cause_steal,
        count(*) FILTER (cause = 'page_fault') AS cause_page_fault,
        count(*) FILTER (cause = 'syscall') AS cause_syscall,
        count(*) FILTER (cause = 'gpu_wait') AS cause_gpu_wait,
        count(*) FILTER (cause = 'launch') AS cause_launch,
        count(*) FILTER (cause = 'uncovered') AS cause_uncovered,
        count(*) FILTER (cause = 'code') AS cause_code,
        count(*) FILTER (cause = 'cpu_slow') AS cause_cpu_slow,
        count(*) FILTER (idle) AS idle_steps
    FROM step_attribution
    GROUP BY run_id, stage, batch
)
SELECT
    run_id,                                              -- run
    stage,                                               -- stage
    batch,                                               -- batch size
    steps,                                               -- steps (idle ones included)
    slow_steps,                                          -- slow steps (step_attribution.slow)
    round(slow_steps / steps, 4) AS slow_share,          -- slow_steps / steps, 0..1
    excess_ns,                                           -- total excess of the slow steps, ns
    submit_excess_ns,                                    -- of which inside submit (per step at most its excess), ns
    round(submit_excess_ns / nullif(excess_ns, 0), 4) AS submit_share, -- submit_excess_ns / excess_ns, 0..1
    CASE greatest(cause_gc, cause_gpu_wait, cause_peer, cause_lock, cause_runqueue, cause_throttled, cause_preemption, cause_blocked, cause_irq, cause_steal, cause_page_fault, cause_syscall, cause_migration, cause_launch, cause_code, cause_submit, cause_gpu_clock, cause_cpu_slow, cause_uncovered, cause_unexplained)
        WHEN 0 THEN NULL
        WHEN cause_gc THEN 'gc'
        WHEN cause_gpu_wait THEN 'gpu_wait'
        WHEN cause_peer THEN 'peer'
        WHEN cause_lock THEN 'lock'
        WHEN cause_runqueue THEN 'runqueue'
        WHEN cause_throttled THEN 'throttled'
        WHEN cause_preemption THEN 'preemption'
        WHEN cause_blocked THEN 'blocked'
        WHEN cause_irq THEN 'irq'
        WHEN cause_steal THEN 'steal'
        WHEN cause_page_fault THEN 'page_fault'
        WHEN cause_syscall THEN 'syscall'
        WHEN cause_migration THEN 'migration'
        WHEN cause_launch THEN 'launch'
        WHEN cause_code THEN 'code'
        WHEN cause_submit THEN 'submit'
        WHEN cause_gpu_clock THEN 'gpu_clock'
        WHEN cause_cpu_slow THEN 'cpu_slow'
        WHEN cause_uncovered THEN 'uncovered'
        ELSE 'unexplained'
    END AS top_cause,        -- most frequent cause among the slow steps (ties: the precedence order)
    cause_gc,              -- slow steps whose cause is gc
    cause_preemption,      -- slow steps whose cause is preemption
    cause_blocked,         -- slow steps whose cause is blocked
    cause_migration,       -- slow steps whose cause is migration
    cause_gpu_clock,       -- slow steps whose cause is gpu_clock
    cause_submit,          -- slow steps whose cause is submit
    cause_unexplained,     -- slow steps whose cause is unexplained
    cause_lock,            -- slow steps whose cause is lock
    cause_peer,            -- slow steps whose cause is peer
    cause_runqueue,        -- slow steps whose cause is runqueue
    cause_throttled,       -- slow steps whose cause is throttled
    cause_irq,             -- slow steps whose cause is irq
    cause_steal,           -- slow steps whose cause is steal
    cause_page_fault,      -- slow steps whose cause is page_fault
    cause_syscall,         -- slow steps whose cause is syscall
    cause_uncovered,       -- slow steps whose cause is uncovered
    cause_gpu_wait,        -- slow steps whose cause is gpu_wait
    cause_launch,          -- slow steps whose cause is launch
    cause_code,            -- slow steps whose cause is code
    cause_cpu_slow,        -- slow steps whose cause is cpu_slow
    idle_steps               -- idle steps (never slow)
FROM a;
