-- Core tables: what probe clients send, and the daemon's own bookkeeping.
-- Times are CLOCK_MONOTONIC nanoseconds unless a column says otherwise.

CREATE SEQUENCE IF NOT EXISTS run_id_seq START 1;

-- One row per probe run (a process's connect(); a forked child is its own run).
CREATE TABLE IF NOT EXISTS runs (
    run_id        BIGINT PRIMARY KEY,   -- daemon-assigned, stable across reconnects
    pid           INTEGER,              -- from SO_PEERCRED, never from the client
    uid           INTEGER,              -- from SO_PEERCRED
    gid           INTEGER,              -- from SO_PEERCRED
    claimed_pid   INTEGER,              -- what the client said (kept for audit only)
    tid           BIGINT,               -- native tid of the thread that connected
    label         VARCHAR,              -- connect(run_label=...)
    host          VARCHAR,              -- daemon's hostname
    started_ns    BIGINT,               -- client's monotonic clock at hello
    realtime_ns   BIGINT,               -- client's CLOCK_REALTIME at the same instant
    python        VARCHAR,              -- e.g. 3.11.7
    implementation VARCHAR,             -- cpython, pypy, ...
    free_threaded BOOLEAN,
    gc_threshold  INTEGER[],            -- gc.get_threshold() at hello
    gc_count      INTEGER[],            -- gc.get_count() at hello
    freeze_count  BIGINT,               -- gc.get_freeze_count() at hello
    gc_enabled    BOOLEAN,
    argv          VARCHAR[],
    client_token  UBIGINT,              -- client's random run token (reconnects)
    connected_ns  BIGINT,               -- daemon's monotonic clock at first hello
    ended_ns      BIGINT,               -- daemon's monotonic clock at BYE/disconnect
    last_seq      BIGINT,               -- highest record sequence number stored
    records       BIGINT,               -- span + GC records stored
    connections   INTEGER               -- how many connections carried this run
);

-- One row per begin/end pair (attached method call or manual span).
CREATE TABLE IF NOT EXISTS spans (
    run_id   BIGINT,
    tid      BIGINT,      -- native thread id (joins with kernel events)
    kind     VARCHAR,     -- step, schedule, submit, collect, ...
    stage    VARCHAR,     -- prefill, prelude, recurrent, coda, ... (NULL if none)
    batch    BIGINT,      -- batch size (0 if unknown)
    start_ns BIGINT,
    end_ns   BIGINT,
    depth    SMALLINT,    -- number of enclosing spans on the thread (0 = outermost)
    seq      BIGINT       -- per-run record sequence number
);

-- One row per garbage collection pass.
CREATE TABLE IF NOT EXISTS gc_events (
    run_id        BIGINT,
    tid           BIGINT,     -- thread the collection ran on
    generation    TINYINT,    -- 0, 1 or 2
    start_ns      BIGINT,
    end_ns        BIGINT,
    collected     BIGINT,     -- objects collected
    uncollectable BIGINT,
    seq           BIGINT
);

-- One row per known gap: records that were produced but not stored.
CREATE TABLE IF NOT EXISTS losses (
    run_id   BIGINT,     -- NULL for kernel or GPU probe losses
    probe    VARCHAR,    -- 'client', 'sched', 'gpu', ...
    start_ns BIGINT,     -- the gap lies within [start_ns, end_ns]
    end_ns   BIGINT,
    count    BIGINT,     -- records lost
    reason   VARCHAR     -- client_disconnected, client_socket_full, client_tail, client_gc_ring_full, daemon_restart, store, ...
);

-- Rejected input (malformed datagrams, unknown records), counted per reason.
CREATE TABLE IF NOT EXISTS ingest_errors (
    ts_ns  BIGINT,      -- daemon's monotonic clock at the flush that wrote it
    run_id BIGINT,      -- NULL before a hello
    pid    INTEGER,     -- SO_PEERCRED pid of the sender
    reason VARCHAR,     -- bad_magic, bad_version, length_mismatch, ...
    count  BIGINT
);

-- What each probe is doing, and if not, why (one row per change).
CREATE TABLE IF NOT EXISTS probe_status (
    ts_ns   BIGINT,
    probe   VARCHAR,    -- 'sched', 'gpu'
    backend VARCHAR,    -- 'bcc', 'perf', 'proc', 'nvml', NULL when none
    state   VARCHAR,    -- 'active', 'unavailable', 'failed', 'stopped'
    detail  VARCHAR     -- the reason and how to fix it, or settings in use
);

-- Span columns added after the first release (wire version 2).
ALTER TABLE spans ADD COLUMN IF NOT EXISTS work BIGINT;    -- the user's work measure (attach(work=...)), NULL if none
ALTER TABLE spans ADD COLUMN IF NOT EXISTS idle BOOLEAN;   -- marked idle (attach(idle=...)); batch 0 is idle too
