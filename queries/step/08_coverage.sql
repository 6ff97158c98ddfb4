-- When each probe covered each run, merged into islands: touching or
-- overlapping coverage rows of one run and probe become one interval (a
-- probe may write a row per restart or per diagnosis window). end_ns NULL
-- (still covering) reads as the end of time.

-- One row per run, probe and covered interval.
CREATE OR REPLACE VIEW step_coverage AS
WITH c AS (
    SELECT run_id, probe, start_ns, coalesce(end_ns, 9223372036854775807) AS end_ns
    FROM coverage WHERE start_ns IS NOT NULL AND coalesce(end_ns, start_ns) >= start_ns
), m AS (
    SELECT c.*, max(end_ns) OVER (PARTITION BY run_id, probe ORDER BY start_ns, end_ns
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_ns
    FROM c
), g AS (
    SELECT m.*, sum(CASE WHEN prev_end_ns IS NULL OR start_ns > prev_end_ns THEN 1 ELSE 0 END)
                OVER (PARTITION BY run_id, probe ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS island
    FROM m
)
SELECT
    run_id,                    -- run
    probe,                     -- 'sched', 'syscalls', 'page_faults', 'irq', 'steal', 'gpu', 'cpu'
    min(start_ns) AS start_ns, -- CLOCK_MONOTONIC ns
    max(end_ns) AS end_ns      -- CLOCK_MONOTONIC ns (9223372036854775807: still covering)
FROM g GROUP BY run_id, probe, island;
