-- Kernel scheduling inside each step, raw: off-CPU time (preempted vs
-- blocked), run-queue wait and migrations of the step's own thread, as the
-- kernel reported them, before step_attribution splits them into disjoint
-- components (there preempted_ns, blocked_ns and runq_ns are the disjoint
-- parts, net of GC time). Empty kernel tables (no sched probe) give no rows
-- here.

-- One row per step with any off-CPU time, run-queue wait or migration.
CREATE OR REPLACE VIEW step_sched AS
SELECT
    run_id,               -- run
    tid,                  -- step's thread
    step_idx,             -- step index on the thread
    preempted_raw_ns AS preempted_ns,  -- off CPU after an involuntary switch-out, ns
    blocked_raw_ns AS blocked_ns,      -- off CPU after a voluntary switch-out (sleep, lock, I/O; includes the run-queue wait after the wakeup), ns
    runq_raw_ns AS runq_ns,            -- runnable but waiting for a CPU, ns (overlaps both above)
    migrations,           -- CPU changes inside the step
    offcpu_intervals,     -- off-CPU intervals overlapping the step
    offcpu_in_submit_ns   -- off-CPU time inside the step's submit calls, ns
FROM _step_components
WHERE offcpu_intervals > 0 OR runq_raw_ns > 0 OR migrations > 0;
