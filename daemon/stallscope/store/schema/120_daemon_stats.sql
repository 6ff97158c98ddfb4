-- The daemon's own footprint: what the tracer costs the machine it traces.

-- One row per sample (every 10 s, and when the set of traced processes
-- changes), written by the daemon about itself (service/selfstats.py).
CREATE TABLE IF NOT EXISTS daemon_stats (
    ts_ns          BIGINT,     -- monotonic ns of the sample
    pid            INTEGER,    -- the daemon's pid
    cpu_ns         BIGINT,     -- the daemon's CPU time so far (user + system, every thread)
    cpu_pct        DOUBLE,     -- CPU used since the previous sample, % of one core
    rss_bytes      BIGINT,     -- resident memory now
    peak_rss_bytes BIGINT,     -- highest resident memory so far (VmHWM)
    cpus           VARCHAR,    -- CPUs the daemon may run on, e.g. '0-3'
    shared_pids    INTEGER[],  -- traced processes allowed on at least one of those CPUs
    warning        VARCHAR     -- placement advice when it shares CPUs with them, else NULL
);

ALTER TABLE daemon_stats ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
