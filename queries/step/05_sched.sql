-- Kernel scheduling inside each step: off-CPU time (preempted vs blocked),
-- run-queue wait and migrations of the step's own thread. Kernel rows are
-- keyed by (pid, tid); the run's pid maps them to the run. Empty kernel
-- tables (no sched probe) give no rows here and zeros in step_attribution.

-- Kernel rows of step threads, as (run, thread, interval).
CREATE OR REPLACE VIEW _sched_step_interval AS
SELECT t.run_id, t.tid, 'offcpu' AS src, o.preempted, o.start_ns AS xs, o.end_ns AS xe
FROM offcpu o JOIN _step_thread t ON o.pid = t.pid AND o.tid = t.tid
WHERE o.end_ns > o.start_ns
UNION ALL
SELECT t.run_id, t.tid, 'runq' AS src, NULL AS preempted, q.start_ns, q.end_ns
FROM runq q JOIN _step_thread t ON q.pid = t.pid AND q.tid = t.tid
WHERE q.end_ns > q.start_ns;

-- Every (kernel interval, step) pair that overlaps, with the intersection.
CREATE OR REPLACE VIEW _sched_step_overlap AS
WITH a AS (
    SELECT i.*, coalesce(s.step_idx, 0) AS ka
    FROM _sched_step_interval i
    ASOF LEFT JOIN _step s ON i.run_id = s.run_id AND i.tid = s.tid AND i.xs >= s.start_ns
), b AS (
    SELECT a.*, s.step_idx AS kb
    FROM a ASOF JOIN _step s ON a.run_id = s.run_id AND a.tid = s.tid AND a.xe > s.start_ns
), p AS (
    -- A thread cannot read the clock while off CPU, so such an interval almost
    -- never straddles a step boundary; the range covers the cases that do.
    SELECT run_id, tid, src, preempted, xs, xe,
           unnest(CASE WHEN ka = kb THEN [ka] ELSE range(ka, kb + 1) END) AS step_idx
    FROM b WHERE kb >= ka
)
SELECT
    f.run_id, f.tid, f.step_idx, p.src, p.preempted,
    least(p.xe, f.end_ns) - greatest(p.xs, f.start_ns) AS overlap_ns,
    CASE WHEN f.submit_start_ns IS NULL THEN 0   -- least/greatest skip NULLs: guard
         ELSE greatest(0, least(p.xe, f.submit_end_ns) - greatest(p.xs, f.submit_start_ns)) END
        AS in_submit_ns
FROM p JOIN _step_frame f USING (run_id, tid, step_idx)
WHERE p.xs < f.end_ns AND f.start_ns < p.xe;

-- Migrations of step threads that happened inside a step.
CREATE OR REPLACE VIEW _sched_step_migration AS
WITH m AS (
    SELECT t.run_id, t.tid, m.ts_ns
    FROM migrations m JOIN _step_thread t ON m.pid = t.pid AND m.tid = t.tid
    WHERE m.from_cpu IS DISTINCT FROM m.to_cpu
)
SELECT m.run_id, m.tid, s.step_idx, count(*) AS migrations
FROM m ASOF JOIN _step s ON m.run_id = s.run_id AND m.tid = s.tid AND m.ts_ns >= s.start_ns
WHERE m.ts_ns < s.end_ns
GROUP BY ALL;

-- One row per step with any off-CPU time, run-queue wait or migration.
CREATE OR REPLACE VIEW step_sched AS
WITH o AS (
    SELECT run_id, tid, step_idx,
        sum(overlap_ns) FILTER (src = 'offcpu' AND preempted)::BIGINT AS preempted_ns,
        sum(overlap_ns) FILTER (src = 'offcpu' AND NOT coalesce(preempted, false))::BIGINT AS blocked_ns,
        sum(overlap_ns) FILTER (src = 'runq')::BIGINT AS runq_ns,
        count(*) FILTER (src = 'offcpu') AS offcpu_intervals,
        sum(in_submit_ns) FILTER (src = 'offcpu')::BIGINT AS offcpu_in_submit_ns
    FROM _sched_step_overlap GROUP BY run_id, tid, step_idx
)
SELECT
    run_id,                                          -- run
    tid,                                             -- step's thread
    step_idx,                                        -- step index on the thread
    coalesce(o.preempted_ns, 0) AS preempted_ns,     -- off CPU after an involuntary switch-out, ns
    coalesce(o.blocked_ns, 0) AS blocked_ns,         -- off CPU after a voluntary switch-out (sleep, lock, I/O; includes the run-queue wait after the wakeup), ns
    coalesce(o.runq_ns, 0) AS runq_ns,               -- runnable but waiting for a CPU, ns (overlaps both above)
    coalesce(m.migrations, 0) AS migrations,         -- CPU changes inside the step
    coalesce(o.offcpu_intervals, 0) AS offcpu_intervals, -- off-CPU intervals overlapping the step
    coalesce(o.offcpu_in_submit_ns, 0) AS offcpu_in_submit_ns -- off-CPU time inside the step's submit calls, ns
FROM o FULL JOIN _sched_step_migration m USING (run_id, tid, step_idx);
