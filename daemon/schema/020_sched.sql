-- Kernel scheduling tables, filled by daemon/probes/sched_*.py.
-- pid is the process (tgid), tid the thread; times CLOCK_MONOTONIC ns.

-- One row per interval a traced thread spent off CPU (switch-out to switch-in).
CREATE TABLE IF NOT EXISTS offcpu (
    pid       INTEGER,
    tid       INTEGER,
    start_ns  BIGINT,    -- switched out
    end_ns    BIGINT,    -- switched back in
    preempted BOOLEAN,   -- involuntary switch-out (still runnable)
    cpu       SMALLINT   -- CPU it was switched out from
);

-- One row per wait on a run queue (runnable -> running).
CREATE TABLE IF NOT EXISTS runq (
    pid      INTEGER,
    tid      INTEGER,
    start_ns BIGINT,     -- became runnable (wakeup or preempted)
    end_ns   BIGINT,     -- started running
    cpu      SMALLINT    -- CPU it ran on
);

-- One row per change of CPU.
CREATE TABLE IF NOT EXISTS migrations (
    pid      INTEGER,
    tid      INTEGER,
    ts_ns    BIGINT,
    from_cpu SMALLINT,
    to_cpu   SMALLINT
);
