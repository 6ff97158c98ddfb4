-- Garbage-collection time inside each step. A pass on any thread of the run
-- stops the step's thread (it holds the GIL), so passes join steps by run,
-- not by thread; the time charged is the intersection of the two intervals.

-- Every (GC pass, step) pair that overlaps, with the intersection.
CREATE OR REPLACE VIEW _step_gc_overlap AS
WITH g AS (
    SELECT g.run_id, t.tid, g.generation, g.start_ns AS xs, g.end_ns AS xe, g.collected
    FROM gc_events g JOIN _step_thread t USING (run_id)
    WHERE g.end_ns > g.start_ns
), a AS (   -- first candidate step: the last one starting at or before the pass
    SELECT g.*, coalesce(s.step_idx, 0) AS ka
    FROM g ASOF LEFT JOIN _step s ON g.run_id = s.run_id AND g.tid = s.tid AND g.xs >= s.start_ns
), b AS (   -- last candidate step: the last one starting before the pass ends
    SELECT a.*, s.step_idx AS kb
    FROM a ASOF JOIN _step s ON a.run_id = s.run_id AND a.tid = s.tid AND a.xe > s.start_ns
), k AS (
    SELECT run_id, tid, generation, xs, xe, collected,
           CASE WHEN ka = kb THEN [ka] ELSE range(ka, kb + 1) END AS ks
    FROM b WHERE kb >= ka
), p AS (
    SELECT run_id, tid, generation, xs, xe, collected, unnest(ks) AS step_idx FROM k
)
SELECT
    f.run_id, f.tid, f.step_idx,
    p.generation,                                                    -- 0, 1 or 2
    p.xs AS gc_start_ns, p.xe AS gc_end_ns, p.collected,
    least(p.xe, f.end_ns) - greatest(p.xs, f.start_ns) AS overlap_ns, -- ns of the pass inside the step
    CASE WHEN f.submit_start_ns IS NULL THEN 0   -- least/greatest skip NULLs: guard
         ELSE greatest(0, least(p.xe, f.submit_end_ns) - greatest(p.xs, f.submit_start_ns)) END
        AS in_submit_ns                                              -- ns of it inside the submit calls
FROM p JOIN _step_frame f USING (run_id, tid, step_idx)
WHERE p.xs < f.end_ns AND f.start_ns < p.xe;

-- One row per step that overlaps at least one GC pass.
CREATE OR REPLACE VIEW step_gc AS
SELECT
    run_id,                                                          -- run
    tid,                                                             -- step's thread
    step_idx,                                                        -- step index on the thread
    sum(overlap_ns)::BIGINT AS gc_ns,                                -- GC time inside the step, ns
    coalesce(sum(overlap_ns) FILTER (generation = 0), 0)::BIGINT AS gc0_ns,       -- of which generation 0, ns
    coalesce(sum(overlap_ns) FILTER (generation = 1), 0)::BIGINT AS gc1_ns,       -- of which generation 1, ns
    coalesce(sum(overlap_ns) FILTER (generation = 2), 0)::BIGINT AS gc2_ns,       -- of which generation 2, ns
    count(*) AS gc_passes,                                           -- passes overlapping the step
    arg_max(generation, (overlap_ns, generation)) AS gc_generation,  -- generation of the pass with the most time inside (ties: older generation)
    sum(collected)::BIGINT AS gc_collected,                          -- objects collected by those passes
    sum(in_submit_ns)::BIGINT AS gc_in_submit_ns                     -- GC time inside the step's submit calls, ns
FROM _step_gc_overlap
GROUP BY run_id, tid, step_idx;
