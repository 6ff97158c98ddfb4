-- Engine steps and their frames: the rows every other step_* view joins to.
-- A step is a span of kind 'step'. Steps on one thread must not overlap
-- (they do not in an engine loop: each _step() returns before the next);
-- the interval joins below rely on it to find a thread's steps by index.

-- One row per step, numbered per (run, thread) in start order.
CREATE OR REPLACE VIEW _step AS
SELECT
    s.run_id,                         -- run (runs.run_id)
    r.pid,                            -- process id from the run (NULL if the run is unknown)
    s.tid,                            -- native thread id
    s.stage,                          -- prefill, prelude, recurrent, coda, ... or NULL
    coalesce(s.batch, 0) AS batch,    -- batch size, 0 if unknown
    s.start_ns,                       -- CLOCK_MONOTONIC ns
    s.end_ns,                         -- CLOCK_MONOTONIC ns
    s.end_ns - s.start_ns AS duration_ns,
    row_number() OVER (PARTITION BY s.run_id, s.tid ORDER BY s.start_ns, s.seq) - 1 AS step_idx
FROM spans s
LEFT JOIN runs r USING (run_id)
WHERE s.kind = 'step' AND s.start_ns IS NOT NULL AND s.end_ns >= s.start_ns;

-- The submit calls inside each step (spans of kind 'submit' on the step's
-- thread lying within it), one row per step that has any.
CREATE OR REPLACE VIEW _step_submit_call AS
WITH sub AS (
    SELECT run_id, tid, start_ns, end_ns
    FROM spans
    WHERE kind = 'submit' AND end_ns >= start_ns
)
SELECT
    st.run_id, st.tid, st.step_idx,
    sum(sub.end_ns - sub.start_ns)::BIGINT AS submit_ns,  -- host time in submit, ns
    min(sub.start_ns) AS submit_start_ns,                 -- first submit call's start
    max(sub.end_ns) AS submit_end_ns,                     -- last submit call's end
    count(*) AS submit_calls
FROM sub
ASOF JOIN _step st
  ON sub.run_id = st.run_id AND sub.tid = st.tid AND sub.start_ns >= st.start_ns
WHERE sub.end_ns <= st.end_ns
GROUP BY ALL;

-- Each step with the bounds of its submit calls (NULL when it has none).
CREATE OR REPLACE VIEW _step_frame AS
SELECT st.*, c.submit_ns, c.submit_start_ns, c.submit_end_ns, c.submit_calls
FROM _step st
LEFT JOIN _step_submit_call c USING (run_id, tid, step_idx);

-- The threads that ran steps, per run.
CREATE OR REPLACE VIEW _step_thread AS
SELECT DISTINCT run_id, pid, tid FROM _step;

-- The measurement window of each run: the first span of kind 'window' if
-- the run has one, else from its first step's start to its last step's end.
CREATE OR REPLACE VIEW step_window AS
WITH w AS (
    SELECT run_id, arg_min(start_ns, start_ns) AS start_ns, arg_min(end_ns, start_ns) AS end_ns
    FROM spans WHERE kind = 'window' GROUP BY run_id
), s AS (
    SELECT run_id, min(start_ns) AS start_ns, max(end_ns) AS end_ns FROM _step GROUP BY run_id
)
SELECT
    s.run_id,                                            -- run
    coalesce(w.start_ns, s.start_ns) AS window_start_ns, -- CLOCK_MONOTONIC ns
    coalesce(w.end_ns, s.end_ns) AS window_end_ns,       -- CLOCK_MONOTONIC ns
    w.run_id IS NOT NULL AS from_window_span             -- true when a 'window' span set it
FROM s LEFT JOIN w USING (run_id);
