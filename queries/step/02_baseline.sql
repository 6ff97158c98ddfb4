-- Step baselines: what a normal step of a given shape costs in a run.

-- Median step duration per run, stage and batch size. The median keeps the
-- slow steps under study from moving their own baseline.
CREATE OR REPLACE VIEW step_baseline AS
SELECT
    run_id,                                               -- run
    stage,                                                -- stage (NULL groups steps without one)
    batch,                                                -- batch size, 0 if unknown
    count(*) AS steps,                                    -- steps in the group
    round(median(duration_ns))::BIGINT AS baseline_ns     -- median step duration, ns
FROM _step
GROUP BY run_id, stage, batch;
