-- Host time of executor.submit inside each step, against its own baseline.

-- One row per step that made at least one submit call (idle steps too; they
-- are left out of the medians).
CREATE OR REPLACE VIEW step_submit AS
WITH f AS (SELECT * FROM _step_frame WHERE submit_ns IS NOT NULL),
b AS (
    SELECT run_id, stage, batch, round(median(submit_ns))::BIGINT AS submit_baseline_ns
    FROM f WHERE NOT idle GROUP BY run_id, stage, batch
)
SELECT
    f.run_id,                 -- run
    f.tid,                    -- thread
    f.step_idx,               -- step index on the thread (0-based, start order)
    f.stage,                  -- step's stage
    f.batch,                  -- step's batch size
    f.submit_calls,           -- submit spans inside the step
    f.submit_ns,              -- host time inside submit, summed over calls, ns
    b.submit_baseline_ns,     -- median submit_ns of the non-idle steps of the same run, stage and batch, ns
    greatest(f.submit_ns - b.submit_baseline_ns, 0) AS submit_excess_ns  -- ns above that median, >= 0
FROM f
LEFT JOIN b ON f.run_id = b.run_id AND f.stage IS NOT DISTINCT FROM b.stage AND f.batch = b.batch;
