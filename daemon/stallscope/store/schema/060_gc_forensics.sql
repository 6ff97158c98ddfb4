-- GC forensics: heap censuses a probe client sent (connect(census=True),
-- `stallscope run --census`) and the GC knobs `stallscope run` applied to a
-- run (--gc-freeze-after, --gc-threshold), which is what an A/B arm is.

-- One row per census: the totals. Counts are of the objects gc.get_objects()
-- returns, i.e. the heap a collection walks; frozen objects are not in them.
CREATE TABLE IF NOT EXISTS heap_census_runs (
    run_id        BIGINT,     -- the run that sent it
    taken_ns      BIGINT,     -- client's monotonic clock when the census started
    phase         VARCHAR,    -- 'start' (connect), 'warm' (mark("warm"), census_after_s, after a freeze), 'close'
    duration_ns   BIGINT,     -- the census's own cost (it holds the GIL: every thread waits this long)
    tracked       BIGINT,     -- GC-tracked objects outside the frozen generation
    freeze_count  BIGINT,     -- gc.get_freeze_count(): objects in the frozen generation
    gc_threshold  INTEGER[],  -- gc.get_threshold() at the census
    gc_count      INTEGER[],  -- gc.get_count() at the census
    top_n         INTEGER,    -- types ranked by count in this census
    other         BIGINT,     -- tracked objects of the types not listed
    other_types   BIGINT      -- how many types are not listed
);

-- One row per type listed in a census: its top_n types by count and, at
-- close, every type the start/warm census ranked (count 0 when gone).
CREATE TABLE IF NOT EXISTS heap_census (
    run_id     BIGINT,     -- the run that sent it
    taken_ns   BIGINT,     -- joins heap_census_runs (run_id, taken_ns)
    phase      VARCHAR,    -- as in heap_census_runs
    type_name  VARCHAR,    -- the type's __qualname__
    module     VARCHAR,    -- the type's __module__
    count      BIGINT,     -- tracked objects of that type
    count_start BIGINT     -- close census only: the start/warm census's count of it (from its full histogram; 0 when absent), NULL otherwise
);

-- GC knobs applied to a run (from its HELLO); NULL when not applied.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS gc_freeze_after_s DOUBLE;      -- gc.collect() + gc.freeze() this many seconds after connect
ALTER TABLE runs ADD COLUMN IF NOT EXISTS gc_threshold_set INTEGER[];    -- gc.set_threshold(...) applied at connect
ALTER TABLE runs ADD COLUMN IF NOT EXISTS census BOOLEAN;                -- the client takes heap censuses
