-- The GPU's clock during each step: the building block for "the GPU clock
-- dropped during this step". One row per step (spans.kind = 'step') and GPU
-- that has samples near it. A step of a few milliseconds usually holds no
-- 10 Hz poll sample, so each step also takes, per GPU and source, the
-- latest sample at or before its start (if no older than 250 ms): the value
-- in force when the step began. Driver-buffer samples (source 'buffer') are
-- finer in time; poll samples carry the clock-event reasons.

CREATE OR REPLACE VIEW gpu_step_clock AS
WITH steps AS (
    SELECT run_id, tid, stage, batch, start_ns, end_ns FROM spans WHERE kind = 'step'
),
threads AS (SELECT DISTINCT run_id, tid FROM steps),
inside AS (     -- each sample in the step of each thread that holds it: the
                -- thread's latest step to start at or before it (a thread's
                -- steps do not overlap), if it has not ended. An ASOF join:
                -- the range join took 59 s on 1 M steps and 61 k samples.
    SELECT s.run_id, s.tid, s.stage, s.batch, s.start_ns, s.end_ns,
           n.gpu, n.source, n.ts_ns, n.sm_clock_mhz, n.clock_event_reasons
    FROM (SELECT * FROM nvml_samples CROSS JOIN threads) n
    ASOF JOIN (SELECT * FROM steps WHERE end_ns > start_ns) s
      ON s.run_id = n.run_id AND s.tid = n.tid AND n.ts_ns >= s.start_ns
    WHERE n.ts_ns < s.end_ns
),
streams AS (SELECT DISTINCT gpu, source FROM nvml_samples),
at_start AS (
    SELECT s.run_id, s.tid, s.stage, s.batch, s.start_ns, s.end_ns,
           n.gpu, n.source, n.ts_ns, n.sm_clock_mhz, n.clock_event_reasons
    FROM (SELECT * FROM steps CROSS JOIN streams) s
    ASOF JOIN nvml_samples n
      ON n.gpu = s.gpu AND n.source = s.source AND n.ts_ns < s.start_ns
    WHERE s.start_ns - n.ts_ns <= 250000000
)
SELECT run_id, tid, stage, batch, start_ns, end_ns,
       gpu,                                                 -- NVML device index
       min(sm_clock_mhz)                  AS min_sm_clock_mhz,  -- lowest SM clock seen, MHz
       max(sm_clock_mhz)                  AS max_sm_clock_mhz,  -- highest, MHz
       bit_or(clock_event_reasons)        AS clock_event_reasons,  -- every reason bit seen (raw)
       gpu_clock_event_reason_names(bit_or(clock_event_reasons)) AS reason_names,
       gpu_clock_event_is_slowdown(bit_or(clock_event_reasons))  AS slowdown,
       count(*) FILTER (WHERE ts_ns >= start_ns)  AS samples_inside,  -- samples taken during the step
       min(start_ns - ts_ns) FILTER (WHERE ts_ns < start_ns) AS lead_ns  -- age of the in-force sample at start, ns
FROM (SELECT * FROM inside UNION ALL SELECT * FROM at_start)
GROUP BY ALL;
