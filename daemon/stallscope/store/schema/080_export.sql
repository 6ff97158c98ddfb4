-- Export bookkeeping: when each row was stored, on a clock that survives
-- reboots, so that `stallscope export parquet` can send only the rows it has
-- not sent before (docs/export.md).
--
-- stored_ns is CLOCK_REALTIME nanoseconds of the store flush that wrote the
-- row, or last changed it (the UPDATEs of runs and coverage set it again).
-- The daemon sets it per flush through the session variable
-- stallscope_stored_ns and makes it strictly increasing across flushes and
-- restarts (max(now, previous + 1)), so every row a later flush writes has a
-- larger value than every row already committed: an exporter that remembers
-- the largest value it sent finds exactly the new and the changed rows,
-- late ones included. Rows written by anything else (a test, an older
-- release's rows when this column was added) have NULL: the first export
-- of the table sends them, later ones do not (the default is only the
-- variable: a function such as epoch_ns() is not there yet while DuckDB
-- replays a WAL with extension autoloading off, as the daemon runs).
-- CLOCK_MONOTONIC restarts at each boot: never used here.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE spans ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE gc_events ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE losses ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE ingest_errors ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE probe_status ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE runq ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE migrations ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE nvml_samples ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE nvml_clock_sync ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE syscalls ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE page_faults ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE irq_time ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE steal ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE coverage ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE run_events ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE heap_census ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
ALTER TABLE heap_census_runs ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT getvariable('stallscope_stored_ns');
