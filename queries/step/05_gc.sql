-- Garbage-collection time inside each step (see _step_overlap: a pass on
-- any thread of the run counts, since it stops the step's thread).

-- One row per step that overlaps at least one GC pass.
CREATE OR REPLACE VIEW step_gc AS
SELECT
    run_id,             -- run
    tid,                -- step's thread
    step_idx,           -- step index on the thread (0-based, start order)
    gc_ns,              -- GC time inside the step (intersection), ns
    gc0_ns,             -- of which generation 0, ns
    gc1_ns,             -- of which generation 1, ns
    gc2_ns,             -- of which generation 2, ns
    gc_passes,          -- passes overlapping the step
    gc_generation,      -- generation of the pass with the most time inside (ties: older generation)
    gc_collected,       -- objects collected by those passes
    gc_in_submit_ns     -- GC time inside the step's submit calls, ns
FROM _step_components
WHERE gc_passes > 0;
