-- Engine steps, their threads, and the time cover that the interval joins
-- use. A step is a span of kind 'step'. Steps on one thread must not
-- overlap (in an engine loop each _step() returns before the next begins).
--
-- How intervals find their step, fast: time is cut into buckets of
-- bucket_ns (the mean step duration, at least 1 ms), and _step_cover holds
-- one row per (step, bucket it touches). An interval joins _step_cover on
-- (thread, bucket of its start) and keeps the step whose span contains its
-- start: an equality hash join, which DuckDB runs in parallel, instead of a
-- range join (on 12 M materialized rows: 2.8 s against 10.6 s for the same
-- mapping by ASOF join; bench/results/attribution.md). Intervals that start
-- outside every step, or reach past the end of theirs, take a slower exact
-- path (ASOF joins); a thread off CPU cannot read the clock, so off-CPU and
-- run-queue intervals rarely straddle a step boundary.

-- One row per step, numbered per (run, thread) in start order.
--
-- Idle steps: a loop iteration that had nothing to do (a continuous-batching
-- engine waits up to ~100 ms for a request) is a step, but not a slow one.
-- A step is idle when the client marked it (spans.idle, attach(idle=...)),
-- or when its batch is 0 on a thread whose other steps report batch sizes.
-- On a thread where every step has batch 0 the engine reports no batch
-- size at all (0 = unknown): there batch 0 means nothing and no step is
-- idle by it. Idle steps are kept in every view, counted on their own, never
-- slow or long, and left out of baselines and percentiles.
CREATE OR REPLACE VIEW _step AS
SELECT
    s.run_id,                         -- run (runs.run_id)
    coalesce(r.pid, -s.run_id) AS pid, -- process id from the run (-run_id when the run is unknown: matches no kernel row)
    s.tid,                            -- native thread id
    s.stage,                          -- prefill, prelude, recurrent, coda, ... or NULL
    coalesce(s.batch, 0) AS batch,    -- batch size, 0 if unknown
    s.start_ns,                       -- CLOCK_MONOTONIC ns
    s.end_ns,                         -- CLOCK_MONOTONIC ns
    s.end_ns - s.start_ns AS duration_ns,  -- ns
    row_number() OVER (PARTITION BY s.run_id, s.tid ORDER BY s.start_ns, s.seq) - 1 AS step_idx,
    s.work,                           -- the user's work measure (attach(work=...)), NULL if none
    coalesce(s.idle, false)
        OR (coalesce(s.batch, 0) = 0
            AND max(coalesce(s.batch, 0)) OVER (PARTITION BY s.run_id, s.tid) > 0) AS idle  -- see above
FROM spans s
LEFT JOIN runs r USING (run_id)
WHERE s.kind = 'step' AND s.start_ns IS NOT NULL AND s.end_ns >= s.start_ns;

-- The bucket size of the interval joins, one row (ns, >= 1 ms).
CREATE OR REPLACE VIEW _step_bucket AS
SELECT greatest(coalesce(avg(duration_ns), 0)::BIGINT, 1000000) AS bucket_ns FROM _step;

-- The threads that ran steps, per run.
CREATE OR REPLACE VIEW _step_thread AS
SELECT DISTINCT run_id, pid, tid FROM _step;

-- One row per (step, bucket its span touches).
CREATE OR REPLACE VIEW _step_cover AS
SELECT s.run_id, s.pid, s.tid, s.step_idx, s.start_ns, s.end_ns,
       unnest(range(s.start_ns // b.bucket_ns, greatest(s.end_ns - 1, s.start_ns) // b.bucket_ns + 1)) AS bucket
FROM _step s, _step_bucket b;

-- The filler's progress per step thread (step_component_threads, written by
-- the daemon: store/step_fill.py), where this session may use it: the
-- table is on (SET VARIABLE step_components_table = false turns it off:
-- every step is then computed from the source tables), the row was computed
-- with this session's step_params.lock_chain_gap_ns, for the pid the run
-- has now, and by this release's filler (fill_version 145, the schema file
-- that last added its columns: vocab.schema.STEP_FILL_VERSION; an older
-- row lacks columns, and the daemon fills such steps again). Steps
-- 0..filled_idx of such a thread are read from step_components; the others
-- are computed here.
CREATE OR REPLACE VIEW _step_frontier AS
SELECT f.run_id, f.tid, f.filled_idx, f.todo_from_ns, f.chain_cut_ns
FROM step_component_threads f
CROSS JOIN step_params p
LEFT JOIN runs r ON r.run_id = f.run_id
WHERE coalesce(getvariable('step_components_table'), true)
  AND f.lock_chain_gap_ns = p.lock_chain_gap_ns
  AND f.pid = coalesce(r.pid, -f.run_id)
  AND f.fill_version = 145;

-- The steps not filled yet (all of them without the filler), with the
-- columns the interval joins need: a thread's steps from its todo_from_ns
-- on, numbered on from filled_idx (the same numbers as _step's, without
-- numbering the thread's whole history again). The daemon's filler alone
-- sets _step_fill_until_ns, to compute a backlog a slice at a time: steps
-- starting after it are left out (never set it in a session: those steps
-- would get no components).
CREATE OR REPLACE VIEW _step_todo AS
SELECT s.run_id, coalesce(r.pid, -s.run_id) AS pid, s.tid, s.start_ns, s.end_ns,
       f.filled_idx + row_number() OVER (PARTITION BY s.run_id, s.tid ORDER BY s.start_ns, s.seq) AS step_idx
FROM spans s
JOIN _step_frontier f ON f.run_id = s.run_id AND f.tid = s.tid AND s.start_ns >= f.todo_from_ns
LEFT JOIN runs r ON r.run_id = s.run_id
WHERE s.kind = 'step' AND s.start_ns IS NOT NULL AND s.end_ns >= s.start_ns
  AND s.start_ns <= coalesce(getvariable('_step_fill_until_ns'), 9223372036854775807)
UNION ALL
SELECT s.run_id, coalesce(r.pid, -s.run_id) AS pid, s.tid, s.start_ns, s.end_ns,
       row_number() OVER (PARTITION BY s.run_id, s.tid ORDER BY s.start_ns, s.seq) - 1 AS step_idx
FROM (SELECT * FROM spans WHERE kind = 'step' AND start_ns IS NOT NULL AND end_ns >= start_ns
      AND start_ns <= coalesce(getvariable('_step_fill_until_ns'), 9223372036854775807)) s
ANTI JOIN _step_frontier f ON f.run_id = s.run_id AND f.tid = s.tid
LEFT JOIN runs r ON r.run_id = s.run_id;

-- Their bucket size (only a join device: any size gives the same pairs).
CREATE OR REPLACE VIEW _step_todo_bucket AS
SELECT greatest(coalesce(avg(end_ns - start_ns), 0)::BIGINT, 1000000) AS bucket_ns FROM _step_todo;

-- One row: how far back the source rows of the unfilled steps can lie.
-- first_ns: no unfilled step starts before it (NULL: none left); a source
-- row ending before it overlaps no unfilled step. offcpu_from_ns: off-CPU
-- rows starting before it are not needed, even for the lock chains of the
-- rows that overlap unfilled steps (-2^63: all are). 2^63-1 when no step
-- is left (not NULL: a number lets the scans skip row groups by their
-- min/max). Read from spans and the small frontier table, not from _step.
CREATE OR REPLACE VIEW _step_todo_bound AS
WITH t AS (
    SELECT run_id, tid, min(start_ns) AS first_ns, max(start_ns) AS last_ns
    FROM spans WHERE kind = 'step' AND start_ns IS NOT NULL AND end_ns >= start_ns
    GROUP BY run_id, tid
)
SELECT
    coalesce(min(CASE WHEN f.run_id IS NULL THEN t.first_ns
                      WHEN t.last_ns >= f.todo_from_ns THEN f.todo_from_ns END),
             9223372036854775807) AS first_ns,
    coalesce(min(CASE WHEN f.run_id IS NULL THEN -9223372036854775808
                      WHEN t.last_ns >= f.todo_from_ns THEN f.chain_cut_ns END),
             9223372036854775807) AS offcpu_from_ns
FROM t LEFT JOIN _step_frontier f USING (run_id, tid);

-- _step_cover of the unfilled steps.
CREATE OR REPLACE VIEW _step_todo_cover AS
SELECT s.run_id, s.pid, s.tid, s.step_idx, s.start_ns, s.end_ns,
       unnest(range(s.start_ns // b.bucket_ns, greatest(s.end_ns - 1, s.start_ns) // b.bucket_ns + 1)) AS bucket
FROM _step_todo s, _step_todo_bucket b;

-- The submit calls inside each step (spans of kind 'submit' on the step's
-- thread lying within it), one row per step that has any; scoped: of the
-- unfilled steps only, else of every step.
CREATE OR REPLACE MACRO _step_submit_call_of(scoped) AS TABLE
SELECT
    c.run_id, c.tid, c.step_idx,
    sum(sub.end_ns - sub.start_ns)::BIGINT AS submit_ns,  -- host time in submit, ns
    min(sub.start_ns) AS submit_start_ns,                 -- first submit call's start
    max(sub.end_ns) AS submit_end_ns,                     -- last submit call's end
    count(*) AS submit_calls
FROM spans sub
CROSS JOIN (SELECT * FROM _step_bucket WHERE NOT scoped
            UNION ALL SELECT * FROM _step_todo_bucket WHERE scoped) b
JOIN (SELECT * FROM _step_cover WHERE NOT scoped
      UNION ALL SELECT * FROM _step_todo_cover WHERE scoped) c
  ON c.run_id = sub.run_id AND c.tid = sub.tid AND c.bucket = sub.start_ns // b.bucket_ns
 AND sub.start_ns >= c.start_ns AND sub.start_ns < c.end_ns
WHERE sub.kind = 'submit' AND sub.end_ns >= sub.start_ns AND sub.end_ns <= c.end_ns
  AND (NOT scoped OR sub.end_ns >= (SELECT first_ns FROM _step_todo_bound))
GROUP BY ALL;

-- The submit calls of every step: the filled ones from step_components.
CREATE OR REPLACE VIEW _step_submit_call AS
SELECT m.run_id, m.tid, m.step_idx, m.submit_ns, m.submit_start_ns, m.submit_end_ns, m.submit_calls
FROM step_components m JOIN _step_frontier f USING (run_id, tid)
WHERE m.step_idx <= f.filled_idx AND m.submit_calls IS NOT NULL
UNION ALL
SELECT * FROM _step_submit_call_of(true);

-- Each step with the bounds of its submit calls (NULL when it has none).
CREATE OR REPLACE VIEW _step_frame AS
SELECT st.*, c.submit_ns, c.submit_start_ns, c.submit_end_ns, c.submit_calls
FROM _step st
LEFT JOIN _step_submit_call c USING (run_id, tid, step_idx);

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
