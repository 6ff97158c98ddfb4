-- Everything that takes time inside a step, joined to the steps once.
-- Sources: GC passes (a pass on any thread of the run stops the step's
-- thread, which needs the GIL, so a pass is joined to every step thread of
-- its run), and the step thread's own off-CPU intervals, run-queue waits
-- and migrations (kernel rows, keyed by (pid, tid), mapped to the run by
-- runs.pid). Time charged = length of the intersection with the step.

-- Kernel rows with resolution_ns set are the /proc backend's per-window
-- totals, not intervals: they cannot be placed in a step and are left out.
-- (Rows of other threads are not filtered out first with a semi join: that
-- made DuckDB underestimate this side and build its hash table on it,
-- several times slower.)
-- Source rows of step threads. src: 0 GC pass, 1 off-CPU, 2 run-queue
-- wait, 3 migration (an instant: xs = xe). Kernel rows keep their pid;
-- GC rows are repeated for every step thread of their run.
CREATE OR REPLACE VIEW _step_interval AS
SELECT t.pid, t.tid, 0::UTINYINT AS src, g.generation, NULL::BOOLEAN AS preempted,
       g.collected, g.start_ns AS xs, g.end_ns AS xe
FROM gc_events g JOIN _step_thread t USING (run_id)
WHERE g.end_ns > g.start_ns
UNION ALL
SELECT pid, tid, 1::UTINYINT, NULL, preempted, NULL, start_ns, end_ns
FROM offcpu WHERE end_ns > start_ns AND resolution_ns IS NULL
UNION ALL
SELECT pid, tid, 2::UTINYINT, NULL, NULL, NULL, start_ns, end_ns
FROM runq WHERE end_ns > start_ns AND resolution_ns IS NULL
UNION ALL
SELECT pid, tid, 3::UTINYINT, NULL, NULL, NULL, ts_ns, ts_ns
FROM migrations WHERE from_cpu IS DISTINCT FROM to_cpu AND resolution_ns IS NULL;

-- Every (source row, step) pair that overlaps (for migrations: the step
-- that contains the instant), with the intersection.
CREATE OR REPLACE VIEW _step_overlap AS
WITH hit AS (   -- the step whose span contains each row's start (bucket equi-join)
    SELECT i.pid, i.tid, i.src, i.generation, i.preempted, i.collected, i.xs, i.xe,
           c.run_id, c.step_idx, c.start_ns, c.end_ns
    FROM _step_interval i
    CROSS JOIN _step_bucket b
    LEFT JOIN _step_cover c
      ON c.pid = i.pid AND c.tid = i.tid AND c.bucket = i.xs // b.bucket_ns
     AND i.xs >= c.start_ns AND i.xs < c.end_ns
), rest AS (    -- starts outside every step, or reaches past its step's end
    SELECT t.run_id, h.tid, h.src, h.generation, h.preempted, h.collected, h.xs, h.xe
    FROM hit h JOIN _step_thread t ON t.pid = h.pid AND t.tid = h.tid
    WHERE h.src <> 3 AND (h.step_idx IS NULL OR h.xe > h.end_ns)
), ra AS (
    SELECT r.*, coalesce(s.step_idx, 0) AS ka
    FROM rest r ASOF LEFT JOIN _step s ON r.run_id = s.run_id AND r.tid = s.tid AND r.xs >= s.start_ns
), rb AS (
    SELECT ra.*, s.step_idx AS kb
    FROM ra ASOF JOIN _step s ON ra.run_id = s.run_id AND ra.tid = s.tid AND ra.xe > s.start_ns
), rp AS (
    SELECT run_id, tid, src, generation, preempted, collected, xs, xe,
           unnest(range(ka, kb + 1)) AS step_idx
    FROM rb WHERE kb >= ka
), pairs AS (
    SELECT run_id, tid, src, generation, preempted, collected, xs, xe, step_idx, start_ns, end_ns
    FROM hit
    WHERE step_idx IS NOT NULL AND (src = 3 OR xe <= end_ns)
    UNION ALL
    SELECT rp.run_id, rp.tid, rp.src, rp.generation, rp.preempted, rp.collected, rp.xs, rp.xe,
           rp.step_idx, s.start_ns, s.end_ns
    FROM rp JOIN _step s USING (run_id, tid, step_idx)
    WHERE rp.xs < s.end_ns AND s.start_ns < rp.xe
)
SELECT run_id, tid, step_idx, src, generation, preempted, collected, xs, xe,
       least(xe, end_ns) - greatest(xs, start_ns) AS overlap_ns   -- ns (0 for migrations)
FROM pairs;

-- Per step, every time component in one pass (step_attribution reads this).
-- The *_in_submit_ns columns need the submit bounds: joined here, per pair.
CREATE OR REPLACE VIEW _step_components AS
WITH o AS (
    SELECT o.*,
        CASE WHEN f.submit_start_ns IS NULL THEN 0   -- least/greatest skip NULLs: guard
             ELSE greatest(0, least(o.xe, f.submit_end_ns) - greatest(o.xs, f.submit_start_ns)) END
            AS in_submit_ns
    FROM _step_overlap o
    LEFT JOIN _step_submit_call f USING (run_id, tid, step_idx)
)
SELECT
    run_id, tid, step_idx,
    coalesce(sum(overlap_ns) FILTER (src = 0), 0)::BIGINT AS gc_ns,
    coalesce(sum(overlap_ns) FILTER (src = 0 AND generation = 0), 0)::BIGINT AS gc0_ns,
    coalesce(sum(overlap_ns) FILTER (src = 0 AND generation = 1), 0)::BIGINT AS gc1_ns,
    coalesce(sum(overlap_ns) FILTER (src = 0 AND generation = 2), 0)::BIGINT AS gc2_ns,
    count(*) FILTER (src = 0) AS gc_passes,
    arg_max(generation, (overlap_ns, generation)) FILTER (src = 0) AS gc_generation,
    sum(collected) FILTER (src = 0)::BIGINT AS gc_collected,
    coalesce(sum(in_submit_ns) FILTER (src = 0), 0)::BIGINT AS gc_in_submit_ns,
    coalesce(sum(overlap_ns) FILTER (src = 1 AND preempted), 0)::BIGINT AS preempted_ns,
    coalesce(sum(overlap_ns) FILTER (src = 1 AND NOT coalesce(preempted, false)), 0)::BIGINT AS blocked_ns,
    coalesce(sum(overlap_ns) FILTER (src = 2), 0)::BIGINT AS runq_ns,
    count(*) FILTER (src = 3) AS migrations,
    count(*) FILTER (src = 1) AS offcpu_intervals,
    coalesce(sum(in_submit_ns) FILTER (src = 1), 0)::BIGINT AS offcpu_in_submit_ns
FROM o
GROUP BY run_id, tid, step_idx;
