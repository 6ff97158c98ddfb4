-- Requests (issue 29, docs/queries.md "Requests"): the lifecycle events a
-- serving engine reports per request (probe.request, probe.request_tokens;
-- REQUEST records of wire version 4), written by ingest/request_events.py.
-- A request is keyed by its run and its 64-bit id (an int id masked to 64
-- bits, or the hash of a str id: probe_client.request_key). Times are
-- CLOCK_MONOTONIC ns, on the clock of steps and GC passes.

-- One row per request of a run: appended when its first event is decoded,
-- then updated as events come (stored_ns moves with each change; exports
-- keep the latest version per (run_id, request_id)).
CREATE TABLE IF NOT EXISTS requests (
    run_id        BIGINT,
    request_id    UBIGINT,   -- the id as the client sent it (int masked to 64 bits, or a str id's hash)
    text          VARCHAR,   -- the str id (its first 64 bytes of UTF-8), NULL for an int id or one never sent
    first_ns      BIGINT,    -- first stored event
    last_ns       BIGINT,    -- last stored event
    end_event     VARCHAR,   -- 'finished' | 'aborted' | 'evicted' (silent past requests.open_timeout_s) | 'handed' (another run of its group serves it), NULL while open
    events        BIGINT,    -- stored events
    output_tokens BIGINT,    -- sum of the token counts of its `token` events
    stored_ns     BIGINT DEFAULT getvariable('stallscope_stored_ns')
);

-- One row per stored event (bad ones are counted in ingest_errors instead).
CREATE TABLE IF NOT EXISTS request_events (
    run_id     BIGINT,
    request_id UBIGINT,     -- requests.request_id
    event      VARCHAR,     -- arrived, scheduled, token, preempted, finished, aborted
    ts_ns      BIGINT,      -- when the client recorded it
    tid        INTEGER,     -- native thread id of the thread that recorded it
    tokens     BIGINT,      -- tokens this event reports (token: produced this step); NULL if none given
    seq        BIGINT,      -- the record's sequence number in its run
    stored_ns  BIGINT DEFAULT getvariable('stallscope_stored_ns')
);
