-- Fleet answers: the seed report's two questions asked of many hosts at once.
-- These views read fleet_step_attribution and fleet_seed_gen2, which
-- `stallscope export fleet` (export/fleet.py) builds from Parquet exports by
-- running the per-host views of queries/ over each host's exported tables:
-- the same rules, host by host (run ids, pids, CPUs and monotonic times only
-- mean something within one host). docs/export.md shows the same queries in
-- Spark SQL over the exported derived tables.

-- One row per host: its generation-2 GC passes and the steps they stalled.
CREATE OR REPLACE VIEW fleet_gen2 AS
SELECT
    host,                                                    -- export --host name
    count(DISTINCT run_id) AS runs,                          -- runs with a gen-2 pass
    count(*) AS gen2_passes,                                 -- generation-2 passes
    count(*) FILTER (stall) AS gen2_stalls,                  -- of which stalled a step (seed_gen2.stall)
    round(max(pause_ms), 3) AS max_pause_ms,                 -- longest gen-2 pause, ms
    round(sum(pause_ms), 3) AS total_pause_ms                -- their total pause, ms
FROM fleet_seed_gen2
GROUP BY host
ORDER BY host;

-- One row per host and cause: how many of the host's slow steps have it.
CREATE OR REPLACE VIEW fleet_slow_causes AS
WITH h AS (
    SELECT host, count(*) FILTER (NOT idle) AS steps, count(*) FILTER (slow) AS slow_steps
    FROM fleet_step_attribution GROUP BY host
)
SELECT
    a.host,                                                   -- export --host name
    a.cause,                                                  -- step_attribution.cause
    count(*) AS slow_steps,                                   -- slow steps with this cause
    h.slow_steps AS host_slow_steps,                          -- all slow steps of the host
    h.steps AS host_steps,                                    -- the host's non-idle steps
    round(count(*) / h.slow_steps, 6) AS share_of_slow,       -- slow_steps / host_slow_steps, 0..1
    round(count(*) / h.steps, 6) AS share_of_steps            -- slow_steps / host_steps, 0..1
FROM fleet_step_attribution a JOIN h USING (host)
WHERE a.slow
GROUP BY a.host, a.cause, h.slow_steps, h.steps
ORDER BY a.host, slow_steps DESC, a.cause;
