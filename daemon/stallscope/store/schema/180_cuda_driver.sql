-- Host time inside the CUDA driver (issue 31): calls of tracked processes to
-- libcuda's launch, synchronisation, polling and copy entry points, timed by
-- uprobes/uretprobes attached per traced process (probes/cuda_bcc.py,
-- docs/cuda-probe.md). A call of at least probes.cuda_threshold_us is one
-- exact row (count = 1, [start_ns, end_ns] its entry and return, name the
-- entry point); shorter calls are summed in the kernel per (thread, kind)
-- and flushed as one row per interval: [start_ns, end_ns] is then that
-- interval (first entry, last return), count the calls and total_ns their
-- summed time, name NULL. A polling loop (cuEventQuery/cuStreamQuery
-- answering "not ready" until the GPU is done) is one 'poll' call from its
-- first query to the one that found the work done. Times CLOCK_MONOTONIC ns.
CREATE TABLE IF NOT EXISTS cuda_calls (
    pid       INTEGER,
    tid       INTEGER,
    kind      VARCHAR,   -- 'launch', 'sync', 'poll' (a polling loop) or 'copy'
    name      VARCHAR,   -- entry point of an exact row, e.g. cuStreamSynchronize_ptsz; NULL for summed rows
    start_ns  BIGINT,
    end_ns    BIGINT,
    count     INTEGER,   -- calls in the row (1 = exact interval; for 'poll': loops)
    total_ns  BIGINT,    -- time inside the calls, ns (= end_ns - start_ns when count = 1)
    calls     INTEGER,   -- driver calls in the row ('poll': the queries of the loops; else = count)
    stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns')
);

-- Per-step CUDA driver components (store/step_fill.py; queries/step/04_overlap.sql).
-- Steps filled before this file have NULL here: the probe did not exist
-- then, so there are no cuda_calls rows to fill them from (and no cuda
-- coverage rows: the views read them as not looked at).
ALTER TABLE step_components ADD COLUMN IF NOT EXISTS cuda_launch_ns BIGINT;       -- time in launch calls, ns
ALTER TABLE step_components ADD COLUMN IF NOT EXISTS cuda_launches BIGINT;        -- launch calls
ALTER TABLE step_components ADD COLUMN IF NOT EXISTS cuda_sync_ns BIGINT;         -- time in synchronisations and polling loops, ns
-- Off-CPU time of the step thread inside its exact sync/poll rows, split
-- (queries/step/04_overlap.sql): while the GPU was still busy (asleep before
-- the wake-up; preempted when the sync went on after it), and held (run-queue
-- wait after the wake-up; a preemption the sync ended right after), ns.
ALTER TABLE step_components ADD COLUMN IF NOT EXISTS cuda_sync_off_ns BIGINT;
ALTER TABLE step_components ADD COLUMN IF NOT EXISTS cuda_sync_held_ns BIGINT;
ALTER TABLE step_components ADD COLUMN IF NOT EXISTS cuda_copy_ns BIGINT;         -- time in memory copies, ns
