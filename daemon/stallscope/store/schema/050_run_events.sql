-- Run events: what a probe client says about its own set-up (wire EVENT
-- datagrams), e.g. an attach spec of `stallscope run` that could not be used.

-- One row per event a client sent.
CREATE TABLE IF NOT EXISTS run_events (
    run_id   BIGINT,     -- the run that sent it
    ts_ns    BIGINT,     -- client's monotonic clock when it happened
    kind     VARCHAR,    -- attached, attach_failed, spec_error, never_imported
    target   VARCHAR,    -- the spec's text (module:Qualname.method=kind,...); '' when none
    message  VARCHAR     -- what happened, in words
);
