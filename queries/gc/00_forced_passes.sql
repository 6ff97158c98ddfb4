-- Generation-2 passes a GC knob ran itself: the gc.collect() that
-- `stallscope run --gc-freeze-after` runs right before gc.freeze(). Its
-- `gc_freeze` run event carries the time just before that collect; the
-- knob's pass is the run's first gen-2 pass starting within 1 s after it.
-- The advice and `compare --arm` leave these out (they are the patch's
-- one-off cost at warm-up, not serving passes).

-- One row per pass a knob forced.
CREATE OR REPLACE VIEW gc_forced_passes AS
SELECT e.run_id,                       -- run
    min(g.start_ns) AS start_ns        -- the pass's start (joins gc_events.start_ns), CLOCK_MONOTONIC ns
FROM run_events e
JOIN gc_events g ON g.run_id = e.run_id AND g.generation = 2
    AND g.start_ns >= e.ts_ns AND g.start_ns < e.ts_ns + 1000000000
WHERE e.kind = 'gc_freeze'
GROUP BY e.run_id, e.ts_ns;
