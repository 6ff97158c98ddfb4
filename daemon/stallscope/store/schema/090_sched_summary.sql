-- Summarised threads of the bcc scheduling probe (probes/sched_summary.py):
-- threads of a traced process that never emit a span (pool workers such as
-- torch's OpenMP threads) get per-interval sums instead of a row per switch
-- in offcpu / runq / migrations, unless [probes] sched_detail is on. The
-- threads that run steps always keep their exact rows there.

-- One row per summarised thread and read interval in which it did anything.
-- Each off-CPU interval, run-queue wait and on-CPU slice is counted once, in
-- the row whose [start_ns, end_ns] holds its end: summed over rows, the
-- totals are exact; the time resolution is the interval (sched_summary_ms).
CREATE TABLE IF NOT EXISTS sched_summary (
    pid          INTEGER,   -- process (tgid)
    tid          INTEGER,   -- thread
    start_ns     BIGINT,    -- interval start (the previous read), CLOCK_MONOTONIC ns
    end_ns       BIGINT,    -- interval end (this read)
    oncpu_ns     BIGINT,    -- on CPU (switch-in to switch-out), ns
    offcpu_ns    BIGINT,    -- off CPU (switch-out to switch-in), ns
    preempted_ns BIGINT,    -- of which after an involuntary switch-out, ns
    runq_ns      BIGINT,    -- runnable but waiting for a CPU, ns
    switches     BIGINT,    -- off-CPU intervals ended (switch-ins)
    preemptions  BIGINT,    -- of which after an involuntary switch-out
    migrations   BIGINT     -- CPU changes
);

-- When each row was stored, for incremental exports (see 080_export.sql; the
-- column is added here because this table is created after that file runs).
ALTER TABLE sched_summary ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
