-- Requests (docs/queries.md "Requests"): each request's lifecycle events
-- (request_events, from probe.request / probe.request_tokens) joined to the
-- engine steps that served them, its latency (time to first token,
-- inter-token latency, end to end) and the causes of the steps that made
-- it slow. An event belongs to the step span of the same run and thread
-- whose interval contains it (start_ns <= ts_ns <= end_ns: an engine records
-- a step's tokens inside the step), none if it fell between steps or on a
-- thread that runs no steps. Times are CLOCK_MONOTONIC ns.

-- One row per stored request event, with the step that contains it.
CREATE OR REPLACE VIEW request_steps AS
SELECT e.run_id,                 -- run
    e.request_id,                -- requests.request_id (UBIGINT)
    e.event,                     -- arrived, scheduled, token, preempted, finished, aborted
    e.ts_ns,                     -- when the client recorded it, ns
    e.tid,                       -- the recording thread
    e.tokens,                    -- tokens it reports (token: produced this step); NULL if none
    e.seq,                       -- its record's sequence number in the run (order among equal times)
    CASE WHEN e.ts_ns <= s.end_ns THEN s.step_idx END AS step_idx,        -- the step (step_attribution.step_idx); NULL: none contains it
    CASE WHEN e.ts_ns <= s.end_ns THEN s.start_ns END AS step_start_ns,  -- that step's start, ns
    CASE WHEN e.ts_ns <= s.end_ns THEN s.end_ns END AS step_end_ns       -- and end, ns
FROM request_events e
ASOF LEFT JOIN _step s
    ON s.run_id = e.run_id AND s.tid = e.tid AND e.ts_ns >= s.start_ns;

-- Inter-token gaps: one row per token event after a request's first, with
-- the previous token event and what happened between them.
CREATE OR REPLACE VIEW _request_gap AS
WITH tok AS (
    SELECT run_id, request_id, ts_ns, tid, step_idx, seq,
           lag(ts_ns) OVER w AS prev_ns,
           lag(tid) OVER w AS prev_tid,
           lag(step_idx) OVER w AS prev_step_idx
    FROM request_steps
    WHERE event = 'token'
    WINDOW w AS (PARTITION BY run_id, request_id ORDER BY ts_ns, seq)
)
SELECT t.run_id, t.request_id, t.ts_ns, t.prev_ns, t.ts_ns - t.prev_ns AS gap_ns,
       t.tid, t.step_idx, t.seq,
       CASE
           WHEN EXISTS (
               SELECT 1 FROM request_events p
               WHERE p.run_id = t.run_id AND p.request_id = t.request_id
                 AND p.event = 'preempted' AND p.ts_ns > t.prev_ns AND p.ts_ns <= t.ts_ns
           ) THEN 'preempted'
           WHEN t.tid = t.prev_tid AND t.step_idx - t.prev_step_idx > 1 THEN 'not_scheduled'
           ELSE 'step'
       END AS gap_kind
FROM tok t
WHERE t.prev_ns IS NOT NULL;

-- One row per request: its latency and what made its worst gap. Request
-- ids are scoped by run group: a request whose arrival another run of the
-- group reported first (vLLM's caller or API server, then its engine core;
-- that run's row ends 'handed', ingest/request_events.py) is one request,
-- the serving run's row, and its arrival is the group's earliest; the
-- handed rows themselves are left out.
--   arrival_ns      its first `arrived` event in its run group; NULL if none was stored
--   ttft_ns         time to first token: first `token` event - arrival_ns
--   e2e_ns          end to end: first `finished`/`aborted` event - arrival_ns (NULL while open)
--   queue_ns        first `scheduled` event - arrival_ns (NULL: never scheduled)
--   itl_*_ns        inter-token latency: the gaps between consecutive token
--                   events (p50 and p99 interpolated, max exact); NULL with
--                   fewer than two token events
--   output_tokens   sum of the token counts of its `token` events
--   worst_step_idx  the step that ended its largest gap (the step holding
--                   the token event after it; ties: the earliest gap)
--   worst_cause     step_attribution.cause of that step (the step
--                   vocabulary; NULL when the step was not slow or none)
--   worst_gap       'preempted' (a `preempted` event in the gap),
--                   'not_scheduled' (steps of the thread ran between the two
--                   tokens without it) or 'step' (consecutive steps served it)
CREATE OR REPLACE VIEW request_latency AS
WITH grp AS (       -- runs of run groups with more than one run
    SELECT run_id, group_key FROM runs WHERE group_key IS NOT NULL
    QUALIFY count(*) OVER (PARTITION BY group_key) > 1
), own AS (
    SELECT run_id, request_id,
           min(ts_ns) FILTER (event = 'arrived') AS own_arrival_ns,
           min(ts_ns) FILTER (event = 'scheduled') AS scheduled_ns,
           min(ts_ns) FILTER (event = 'token') AS first_token_ns,
           min(ts_ns) FILTER (event IN ('finished', 'aborted')) AS end_ns,
           arg_min(event, ts_ns) FILTER (event IN ('finished', 'aborted')) AS end_event,
           coalesce(sum(tokens) FILTER (event = 'token'), 0) AS output_tokens
    FROM request_events
    GROUP BY run_id, request_id
), handoff AS (     -- arrivals that another run of the group served
    SELECT g.group_key, o.request_id,
           min(o.own_arrival_ns) AS arrival_ns,
           arg_min(o.run_id, o.own_arrival_ns) AS arrival_run_id
    FROM own o
    JOIN requests r USING (run_id, request_id)
    JOIN grp g USING (run_id)
    WHERE r.end_event = 'handed' AND o.own_arrival_ns IS NOT NULL
    GROUP BY ALL
), ev AS (
    SELECT o.*,
           least(o.own_arrival_ns, h.arrival_ns) AS arrival_ns,
           CASE WHEN h.arrival_ns < o.own_arrival_ns OR o.own_arrival_ns IS NULL
                THEN h.arrival_run_id ELSE o.run_id END AS arrival_run_id
    FROM own o
    LEFT JOIN grp g USING (run_id)
    LEFT JOIN handoff h ON h.group_key = g.group_key AND h.request_id = o.request_id
),
gaps AS (
    SELECT run_id, request_id,
           quantile_cont(gap_ns, 0.5)::BIGINT AS itl_p50_ns,
           quantile_cont(gap_ns, 0.99)::BIGINT AS itl_p99_ns,
           max(gap_ns) AS itl_max_ns,
           arg_max({'tid': tid, 'step_idx': step_idx, 'kind': gap_kind}, (gap_ns, -ts_ns, -seq)) AS worst
    FROM _request_gap
    GROUP BY run_id, request_id
)
SELECT e.run_id,                                   -- run
    e.request_id,                                  -- requests.request_id
    r.text,                                        -- the str id, NULL for an int id
    e.arrival_ns,                                  -- ns (see above)
    e.first_token_ns - e.arrival_ns AS ttft_ns,    -- ns
    e.end_ns - e.arrival_ns AS e2e_ns,             -- ns
    e.scheduled_ns - e.arrival_ns AS queue_ns,     -- ns
    g.itl_p50_ns,                                  -- ns
    g.itl_p99_ns,                                  -- ns
    g.itl_max_ns,                                  -- ns
    e.output_tokens,                               -- tokens
    g.worst.step_idx AS worst_step_idx,            -- step_attribution.step_idx on the token's thread
    a.cause AS worst_cause,                        -- the step vocabulary, NULL if that step was not slow
    g.worst.kind AS worst_gap,                     -- 'step' | 'not_scheduled' | 'preempted'
    e.end_event,                                   -- 'finished' | 'aborted', NULL while open
    e.arrival_run_id,                              -- the run whose `arrived` gave arrival_ns (the caller's for a hand-off)
    e.own_arrival_ns                               -- its first `arrived` in its own run, ns (the engine core's for a hand-off)
FROM ev e
LEFT JOIN gaps g USING (run_id, request_id)
LEFT JOIN requests r USING (run_id, request_id)
LEFT JOIN step_attribution a
    ON a.run_id = e.run_id AND a.tid = g.worst.tid AND a.step_idx = g.worst.step_idx
WHERE r.end_event IS DISTINCT FROM 'handed';

-- Per request and cause: the excess (duration above baseline) of the slow
-- steps that served it (held one of its token events), by their cause; a
-- step counted once per request. Causes are step_attribution's; steps that
-- were not slow are left out.
CREATE OR REPLACE VIEW request_cause_ns AS
SELECT s.run_id,                      -- run
    s.request_id,                     -- requests.request_id
    a.cause,                          -- the step vocabulary
    sum(greatest(a.excess_ns, 0))::BIGINT AS ns  -- ns of step excess with this cause
FROM (SELECT DISTINCT run_id, request_id, tid, step_idx FROM request_steps
      WHERE event = 'token' AND step_idx IS NOT NULL) s
JOIN step_attribution a ON a.run_id = s.run_id AND a.tid = s.tid AND a.step_idx = s.step_idx
WHERE a.cause IS NOT NULL AND a.slow
GROUP BY ALL;
