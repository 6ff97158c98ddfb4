-- GC advice: the figures behind "should the engine call gc.freeze() after
-- warm-up, or raise the gen-2 threshold?" (the report prints the arithmetic).
-- Assumptions, stated once: a gen-2 pass's pause is linear in the objects it
-- walks; the objects walked at a pass are the tracked heap interpolated
-- linearly in time between the start/warm census and the close census
-- (garbage included: the census counts it too); CPython <= 3.13 runs a
-- gen-2 pass only when more than threshold[2] gen-1-eligible passes have
-- happened since the last one AND the objects that survived into generation
-- 2 since then exceed 25% of the long-lived heap (the "25% rule").

-- Generation-2 passes the engine ran (a knob's own gc.collect() left out,
-- see gc_forced_passes), each with the objects it walked, estimated only
-- between the two censuses (NULL outside them).
CREATE OR REPLACE VIEW _gc_advice_pass AS
SELECT g.run_id, g.start_ns, g.end_ns - g.start_ns AS pause_ns, g.collected,
    CASE WHEN g.start_ns >= p.start_taken_ns AND g.start_ns <= p.end_taken_ns THEN
        p.tracked_start + (p.tracked_end - p.tracked_start)
            * ((g.start_ns - p.start_taken_ns) / nullif(p.end_taken_ns - p.start_taken_ns, 0)::DOUBLE)
    END AS walked_est
FROM gc_events g LEFT JOIN _heap_census_pair p USING (run_id)
WHERE g.generation = 2
  AND NOT EXISTS (SELECT 1 FROM gc_forced_passes f WHERE f.run_id = g.run_id AND f.start_ns = g.start_ns);

-- One row per run with a generation-2 pass or a census.
CREATE OR REPLACE VIEW gc_advice AS
WITH g AS (
    SELECT run_id,
        count(*) AS gen2_count,
        median(pause_ns) AS pause_median_ns,
        max(pause_ns) AS pause_max_ns,
        median(collected) AS collected_median,
        median(walked_est) AS walked_median,
        median(pause_ns / nullif(walked_est, 0)) AS ns_per_object
    FROM _gc_advice_pass GROUP BY run_id
), gi AS (
    SELECT run_id, median(gap_ns) AS interval_median_ns FROM (
        SELECT run_id, start_ns - lag(start_ns) OVER (PARTITION BY run_id ORDER BY start_ns) AS gap_ns
        FROM _gc_advice_pass)
    WHERE gap_ns IS NOT NULL GROUP BY run_id
), g1 AS (
    SELECT run_id, count(*) FILTER (generation = 1) AS gen1_count FROM gc_events GROUP BY run_id
), runs_ AS (
    SELECT run_id FROM g UNION SELECT run_id FROM _heap_census_pair
)
SELECT
    x.run_id,                                                        -- run
    r.label,                                                         -- run label
    r.python,                                                        -- interpreter version (the GC's rules depend on it)
    r.gc_freeze_after_s,                                             -- knob applied to this run (NULL: none)
    r.gc_threshold_set,                                              -- knob applied to this run (NULL: none)
    coalesce(g.gen2_count, 0) AS gen2_count,                         -- generation-2 passes (a knob's own gc.collect() not counted)
    coalesce(g1.gen1_count, 0) AS gen1_count,                        -- generation-1 passes
    round(g.pause_median_ns / 1e6, 3) AS pause_median_ms,            -- median gen-2 pause, ms
    round(g.pause_max_ns / 1e6, 3) AS pause_max_ms,                  -- longest gen-2 pause, ms
    g.collected_median,                                              -- median objects a gen-2 pass collected
    round(gi.interval_median_ns / 1e9, 3) AS interval_median_s,      -- median time between gen-2 passes, s (NULL: fewer than 2)
    p.start_phase AS census_from,                                    -- 'start' or 'warm': the census growth is counted from
    p.tracked_start,                                                 -- tracked objects (not frozen) at that census
    p.tracked_end,                                                   -- at the close census
    p.freeze_count_start,                                            -- gc.get_freeze_count() at that census
    p.freeze_count_end,                                              -- at close
    round(g.walked_median) AS walked_est,                            -- objects a gen-2 pass walked (median estimate, see assumptions)
    round(g.ns_per_object, 2) AS ns_per_object,                      -- pause per object walked, ns (median over passes)
    p.tracked_start AS freeze_objects,                               -- objects gc.freeze() at the start/warm census would have frozen
    round(g.ns_per_object * greatest(g.walked_median - p.tracked_start, 0) / 1e6, 3)
        AS pause_after_freeze_est_ms,                                -- expected gen-2 pause with those frozen: ns_per_object x (walked_est - freeze_objects), ms
    r.gc_threshold[3] AS threshold2,                                 -- gc.get_threshold()[2] at hello
    round((coalesce(g1.gen1_count, 0) + g.gen2_count) / g.gen2_count::DOUBLE, 1)
        AS eligible_per_gen2,                                        -- gen-1-eligible passes per gen-2 pass: above threshold2 + 1, the 25% rule (not the threshold) set the pace
    (coalesce(g1.gen1_count, 0) + g.gen2_count) / g.gen2_count::DOUBLE <= r.gc_threshold[3] + 1.5
        AS threshold2_binding,                                       -- the threshold, not the 25% rule, set the pace of gen-2 passes
    ceil(2 * (coalesce(g1.gen1_count, 0) + g.gen2_count) / g.gen2_count::DOUBLE)::BIGINT - 1
        AS threshold2_for_half,                                      -- a threshold[2] at or above this halves the gen-2 passes (at most half as many)
    floor((coalesce(g1.gen1_count, 0) + g.gen2_count) / (r.gc_threshold[3] + 1)::DOUBLE)::BIGINT
        AS gen2_max_if_rule_off                                      -- gen-2 passes if the 25% rule never held them back (e.g. after gc.freeze() shrinks the long-lived heap it measures against)
FROM runs_ x
LEFT JOIN g USING (run_id)
LEFT JOIN gi USING (run_id)
LEFT JOIN g1 USING (run_id)
LEFT JOIN _heap_census_pair p USING (run_id)
LEFT JOIN runs r USING (run_id)
ORDER BY x.run_id;
