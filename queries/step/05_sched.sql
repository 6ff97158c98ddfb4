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
-- A thread cannot read the clock while it is off CPU or waiting to run, so
-- such an interval lies within one step or between two: one ASOF join (the
-- last step starting at or before the interval) finds its step. The few
-- intervals that still reach past that step's end (clock reads a few ns
-- apart, coarse probes) take a second path over every step they cover.
CREATE OR REPLACE VIEW _sched_step_overlap AS
WITH a AS (
    SELECT i.run_id, i.tid, i.src, i.preempted, i.xs, i.xe,
           f.step_idx, f.start_ns, f.end_ns, f.submit_start_ns, f.submit_end_ns
    FROM _sched_step_interval i
    ASOF LEFT JOIN _step_frame f ON i.run_id = f.run_id AND i.tid = f.tid AND i.xs >= f.start_ns
), straddle AS (   -- starts before the first step, or ends past its step's end
    SELECT run_id, tid, src, preempted, xs, xe, coalesce(step_idx, 0) AS ka
    FROM a WHERE step_idx IS NULL OR xe > end_ns
), sb AS (
    SELECT s.*, f.step_idx AS kb
    FROM straddle s ASOF JOIN _step f ON s.run_id = f.run_id AND s.tid = f.tid AND s.xe > f.start_ns
), sp AS (
    SELECT run_id, tid, src, preempted, xs, xe, unnest(range(ka, kb + 1)) AS step_idx
    FROM sb WHERE kb >= ka
), pairs AS (
    SELECT run_id, tid, src, preempted, xs, xe, step_idx, start_ns, end_ns, submit_start_ns, submit_end_ns
    FROM a WHERE step_idx IS NOT NULL AND xe <= end_ns AND xs < end_ns
    UNION ALL
    SELECT sp.run_id, sp.tid, sp.src, sp.preempted, sp.xs, sp.xe, sp.step_idx,
           f.start_ns, f.end_ns, f.submit_start_ns, f.submit_end_ns
    FROM sp JOIN _step_frame f USING (run_id, tid, step_idx)
    WHERE sp.xs < f.end_ns AND f.start_ns < sp.xe
)
SELECT
    run_id, tid, step_idx, src, preempted,
    least(xe, end_ns) - greatest(xs, start_ns) AS overlap_ns,
    CASE WHEN submit_start_ns IS NULL THEN 0   -- least/greatest skip NULLs: guard
         ELSE greatest(0, least(xe, submit_end_ns) - greatest(xs, submit_start_ns)) END
        AS in_submit_ns
FROM pairs;

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
