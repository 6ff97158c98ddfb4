-- Heap growth: which types the GC-tracked heap gained between a run's start
-- (or warm) census and its close census (connect(census=True), `stallscope
-- run --census`). Counts exclude frozen objects (gc.get_objects() skips them).

-- Per run with a close census: the census growth is counted from (the latest
-- start or warm census before the close one) and the close census.
CREATE OR REPLACE VIEW _heap_census_pair AS
WITH e AS (
    SELECT run_id, max(taken_ns) AS end_taken_ns FROM heap_census_runs
    WHERE phase = 'close' GROUP BY run_id
)
SELECT e.run_id,
    arg_max(s.taken_ns, s.taken_ns) AS start_taken_ns,
    arg_max(s.phase, s.taken_ns) AS start_phase,
    arg_max(s.tracked, s.taken_ns) AS tracked_start,
    arg_max(s.freeze_count, s.taken_ns) AS freeze_count_start,
    e.end_taken_ns,
    max(c.tracked) AS tracked_end,
    max(c.freeze_count) AS freeze_count_end
FROM e
JOIN heap_census_runs s ON s.run_id = e.run_id AND s.phase IN ('start', 'warm') AND s.taken_ns <= e.end_taken_ns
JOIN heap_census_runs c ON c.run_id = e.run_id AND c.taken_ns = e.end_taken_ns AND c.phase = 'close'
GROUP BY e.run_id, e.end_taken_ns;

-- One row per type either census ranked, per run; largest growth first.
CREATE OR REPLACE VIEW heap_growth AS
SELECT
    c.run_id,                                                -- run
    c.type_name,                                             -- the type's __qualname__
    c.module,                                                -- the type's __module__
    c.count_start,                                           -- tracked objects of the type at the start/warm census
    c.count AS count_end,                                    -- at the close census
    c.count - c.count_start AS growth,                       -- count_end - count_start (negative: it shrank)
    p.start_phase AS from_phase,                             -- 'start' (connect) or 'warm' (mark("warm"), census_after_s, after a freeze)
    round((p.end_taken_ns - p.start_taken_ns) / 1e9, 3) AS span_s  -- seconds between the two censuses
FROM heap_census c
JOIN _heap_census_pair p ON c.run_id = p.run_id AND c.taken_ns = p.end_taken_ns
WHERE c.phase = 'close' AND c.count_start IS NOT NULL
ORDER BY c.run_id, growth DESC, c.module, c.type_name;
