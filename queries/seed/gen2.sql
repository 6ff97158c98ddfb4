-- The seed report's gen-2 table: one row per generation-2 GC pass, placed in
-- its run's measurement window (step_window) and on the step it stalled.

-- Every step with its 0-based index among the run's steps that start inside
-- the run's measurement window (NULL outside it), all threads, start order.
-- (Written without FILTER in a window: DuckDB's windowed count(*) FILTER
-- took 10-30 s of CPU per 1 M steps; a row number and a sum take 0.1 s.)
CREATE OR REPLACE VIEW _seed_window_step AS
WITH s AS (
    SELECT s.*, s.start_ns >= w.window_start_ns AND s.start_ns < w.window_end_ns AS in_window
    FROM _step s JOIN step_window w USING (run_id)
)
SELECT * EXCLUDE (in_window),
    CASE WHEN in_window THEN
        row_number() OVER (PARTITION BY run_id, in_window ORDER BY start_ns, tid) - 1
    END AS window_step_idx,
    sum(in_window::INTEGER) OVER (PARTITION BY run_id)::BIGINT AS window_steps
FROM s;

-- One row per generation-2 GC pass.
CREATE OR REPLACE VIEW seed_gen2 AS
WITH hit AS (   -- the step each pass overlapped most
    SELECT run_id, xs AS gc_start_ns,
           arg_max(tid, (overlap_ns, -step_idx)) AS tid, arg_max(step_idx, (overlap_ns, -step_idx)) AS step_idx,
           max(overlap_ns) AS overlap_ns
    FROM _step_overlap_of(0, 0, false) WHERE generation = 2  -- the GC rows only
    GROUP BY run_id, xs
)
SELECT
    g.run_id,                                                     -- run
    r.label,                                                      -- run label
    g.start_ns AS gc_start_ns,                                    -- CLOCK_MONOTONIC ns
    round((g.start_ns - w.window_start_ns) / 1e9, 3) AS window_s, -- pass start, s into the measurement window (negative before it)
    g.start_ns >= w.window_start_ns AND g.start_ns < w.window_end_ns AS in_window, -- started inside the window
    ws.window_step_idx AS step_idx,                               -- overlapped step's 0-based index in the window, NULL outside or when it overlapped no step
    ws.window_steps,                                              -- steps in the run's window
    round((g.end_ns - g.start_ns) / 1e6, 3) AS pause_ms,          -- pass duration, ms
    g.collected,                                                  -- objects collected
    g.uncollectable,                                              -- objects found uncollectable
    ws.stage,                                                     -- overlapped step's stage (NULL: no stage, or no step: see step_idx)
    ws.batch,                                                     -- overlapped step's batch size
    round(ws.duration_ns / 1e6, 3) AS step_ms,                    -- overlapped step's duration, ms
    round(h.overlap_ns / 1e6, 3) AS overlap_ms,                   -- pass time inside that step, ms
    coalesce(ws.stage = p.prefill_stage, false) AS in_prefill,    -- landed in a prefill step (step_params.prefill_stage; the seed does not count it as a stall)
    ws.step_idx IS NOT NULL AND ws.stage IS DISTINCT FROM p.prefill_stage
        AND NOT ws.idle AS stall,                                 -- stalled a step that is neither prefill nor idle (a step without a stage counts)
    coalesce(ws.idle, false) AS in_idle                           -- landed in an idle step (not a stall)
FROM gc_events g
CROSS JOIN step_params p
LEFT JOIN runs r USING (run_id)
LEFT JOIN step_window w USING (run_id)
LEFT JOIN hit h ON h.run_id = g.run_id AND h.gc_start_ns = g.start_ns
LEFT JOIN _seed_window_step ws ON ws.run_id = h.run_id AND ws.tid = h.tid AND ws.step_idx = h.step_idx
WHERE g.generation = 2;
