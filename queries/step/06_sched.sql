-- Kernel scheduling inside each step: off-CPU time (preempted vs blocked),
-- run-queue wait and migrations of the step's own thread. Empty kernel
-- tables (no sched probe) give no rows here and zeros in step_attribution.

-- One row per step with any off-CPU time, run-queue wait or migration.
CREATE OR REPLACE VIEW step_sched AS
SELECT
    run_id,               -- run
    tid,                  -- step's thread
    step_idx,             -- step index on the thread
    preempted_ns,         -- off CPU after an involuntary switch-out, ns
    blocked_ns,           -- off CPU after a voluntary switch-out (sleep, lock, I/O; includes the run-queue wait after the wakeup), ns
    runq_ns,              -- runnable but waiting for a CPU, ns (overlaps both above)
    migrations,           -- CPU changes inside the step
    offcpu_intervals,     -- off-CPU intervals overlapping the step
    offcpu_in_submit_ns   -- off-CPU time inside the step's submit calls, ns
FROM _step_components
WHERE offcpu_intervals > 0 OR runq_ns > 0 OR migrations > 0;
