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

-- Sampled rows. The bcc and perf backends write one row per event and leave
-- these NULL. The /proc backend (last resort) cannot see single events: it
-- writes one row per thread and sampling window [start_ns, end_ns] holding
-- the kernel's counters for that window, with resolution_ns set to the
-- window's length. Read such rows as totals, never as intervals.
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS resolution_ns BIGINT;   -- NULL: exact event row
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS events INTEGER;         -- switch-outs in the window (voluntary + preempted)
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS preempted_events INTEGER; -- of which involuntary (nonvoluntary_ctxt_switches)
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS offcpu_ns BIGINT;       -- window length minus on-CPU time (schedstat), nanoseconds
ALTER TABLE runq ADD COLUMN IF NOT EXISTS resolution_ns BIGINT;     -- NULL: exact event row
ALTER TABLE runq ADD COLUMN IF NOT EXISTS events INTEGER;           -- waits ended in the window (schedstat timeslices)
ALTER TABLE runq ADD COLUMN IF NOT EXISTS wait_ns BIGINT;           -- run-queue wait in the window (schedstat), nanoseconds
ALTER TABLE migrations ADD COLUMN IF NOT EXISTS resolution_ns BIGINT; -- NULL: exact event row
ALTER TABLE migrations ADD COLUMN IF NOT EXISTS events INTEGER;     -- CPU changes in the window (se.nr_migrations)
