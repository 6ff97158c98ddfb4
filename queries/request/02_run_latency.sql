-- Per run: the distributions of its requests' latency and the causes of
-- their tails (docs/queries.md "Requests"). TTFT and end-to-end percentiles
-- are over the run's requests (request_latency); ITL percentiles over every
-- inter-token gap of the run (_request_gap), not over per-request
-- percentiles. The tail is the slowest 1 % (at least one): the requests at
-- or above the run's TTFT p99, by the cause of the step that held their
-- first token, and the gaps at or above the run's ITL p99, by the cause of
-- the step that ended them; a step that was not slow counts as
-- 'not_slow', a gap in which the request was not served as its gap kind
-- ('not_scheduled', 'preempted'). Each list: 'cause n, cause n, ...', the
-- most frequent first.

-- One row per run with requests.
CREATE OR REPLACE VIEW request_run_latency AS
WITH l AS MATERIALIZED (
    SELECT * FROM request_latency
), a AS MATERIALIZED (  -- one reading of step_attribution for both tails (each costs ~0.7 s)
    SELECT run_id, tid, step_idx, cause FROM step_attribution
    WHERE run_id IN (SELECT run_id FROM request_events)
), p AS (
    SELECT run_id, count(*) AS requests,
           count(*) FILTER (end_event = 'finished') AS finished,
           count(*) FILTER (end_event = 'aborted') AS aborted,
           quantile_cont(ttft_ns, 0.5)::BIGINT AS ttft_p50_ns,
           quantile_cont(ttft_ns, 0.9)::BIGINT AS ttft_p90_ns,
           quantile_cont(ttft_ns, 0.99)::BIGINT AS ttft_p99_ns,
           quantile_cont(e2e_ns, 0.5)::BIGINT AS e2e_p50_ns,
           quantile_cont(e2e_ns, 0.99)::BIGINT AS e2e_p99_ns
    FROM l GROUP BY run_id
), gq AS (
    SELECT run_id, count(*) AS gaps,
           quantile_cont(gap_ns, 0.5)::BIGINT AS itl_p50_ns,
           quantile_cont(gap_ns, 0.9)::BIGINT AS itl_p90_ns,
           quantile_cont(gap_ns, 0.99)::BIGINT AS itl_p99_ns,
           max(gap_ns) AS itl_max_ns
    FROM _request_gap GROUP BY run_id
), first_tok AS (   -- each request's first token event and its step
    SELECT run_id, request_id, arg_min({'tid': tid, 'step_idx': step_idx}, (ts_ns, seq)) AS s
    FROM request_steps WHERE event = 'token' GROUP BY run_id, request_id
), ttft_tail AS (
    SELECT l.run_id, coalesce(a.cause, CASE WHEN a.step_idx IS NULL THEN 'no_step' ELSE 'not_slow' END) AS cause
    FROM l JOIN p USING (run_id)
    LEFT JOIN first_tok f USING (run_id, request_id)
    LEFT JOIN a ON a.run_id = l.run_id AND a.tid = f.s.tid AND a.step_idx = f.s.step_idx
    WHERE l.ttft_ns >= p.ttft_p99_ns
), itl_tail AS (
    SELECT g.run_id,
           CASE WHEN g.gap_kind <> 'step' THEN g.gap_kind
                ELSE coalesce(a.cause, CASE WHEN a.step_idx IS NULL THEN 'no_step' ELSE 'not_slow' END) END AS cause
    FROM _request_gap g JOIN gq USING (run_id)
    LEFT JOIN a ON a.run_id = g.run_id AND a.tid = g.tid AND a.step_idx = g.step_idx
    WHERE g.gap_ns >= gq.itl_p99_ns
), tails AS (
    SELECT run_id, 'ttft' AS what, cause, count(*) AS n FROM ttft_tail GROUP BY ALL
    UNION ALL
    SELECT run_id, 'itl', cause, count(*) FROM itl_tail GROUP BY ALL
), lists AS (
    SELECT run_id,
           string_agg(format('{} {}', cause, n), ', ' ORDER BY n DESC, cause) FILTER (what = 'ttft') AS ttft_tail_causes,
           string_agg(format('{} {}', cause, n), ', ' ORDER BY n DESC, cause) FILTER (what = 'itl') AS itl_tail_causes
    FROM tails GROUP BY run_id
)
SELECT p.run_id,          -- run
    p.requests,           -- requests with a stored event
    p.finished,           -- of which finished
    p.aborted,            -- of which aborted (the rest are open)
    p.ttft_p50_ns,        -- time to first token, over the run's requests, ns
    p.ttft_p90_ns,        -- ns
    p.ttft_p99_ns,        -- ns
    gq.gaps,              -- inter-token gaps of the run
    gq.itl_p50_ns,        -- inter-token latency over every gap of the run, ns
    gq.itl_p90_ns,        -- ns
    gq.itl_p99_ns,        -- ns
    gq.itl_max_ns,        -- ns
    p.e2e_p50_ns,         -- end to end, over its ended requests, ns
    p.e2e_p99_ns,         -- ns
    t.ttft_tail_causes,   -- the slowest 1 % by TTFT, by their first token's step cause: 'gc 3, not_slow 1'
    t.itl_tail_causes     -- the slowest 1 % of gaps by the cause of the step that ended them
FROM p LEFT JOIN gq USING (run_id) LEFT JOIN lists t USING (run_id);
