-- GPU clocks during each step. NVML samples are host-wide points in time;
-- each one stands for the interval until the next sample of the same GPU
-- (at most step_params.gpu_sample_hold_ns). With several GPUs, every GPU
-- is joined unless step_params.gpu (SET VARIABLE step_gpu = N) picks one.

-- NVML samples as held intervals, numbered per GPU in time order.
CREATE OR REPLACE VIEW _gpu_sample_interval AS
SELECT
    n.gpu, n.ts_ns AS xs,
    least(coalesce(lead(n.ts_ns) OVER w, n.ts_ns + p.gpu_sample_hold_ns), n.ts_ns + p.gpu_sample_hold_ns) AS xe,
    n.sm_clock_mhz, n.clock_event_reasons,
    coalesce(n.clock_event_reasons & 1, 0) = 1 AS idle,   -- NVML reason bit 0x1: GPU idle
    row_number() OVER w - 1 AS sample_idx
FROM nvml_samples n, step_params p
-- poll samples only: they carry the clock-event reasons (the idle bit);
-- the driver-buffer rows (source 'buffer') are in gpu_step_clock
WHERE (p.gpu IS NULL OR n.gpu = p.gpu) AND n.source IS DISTINCT FROM 'buffer'
WINDOW w AS (PARTITION BY n.gpu ORDER BY n.ts_ns);

-- The reference SM clock of each GPU during each run: the median over the
-- non-idle samples taken between the run's first step and its last.
CREATE OR REPLACE VIEW gpu_run_clock AS
WITH r AS (SELECT run_id, min(start_ns) AS s, max(end_ns) AS e FROM _step GROUP BY run_id)
SELECT
    r.run_id,                                             -- run
    i.gpu,                                                -- NVML device index
    round(median(i.sm_clock_mhz))::INTEGER AS reference_sm_clock_mhz, -- median non-idle SM clock, MHz
    count(*) AS samples                                   -- non-idle samples in the run
FROM r JOIN _gpu_sample_interval i ON i.xs >= r.s AND i.xs <= r.e
WHERE NOT i.idle AND i.sm_clock_mhz IS NOT NULL
GROUP BY r.run_id, i.gpu;

-- One row per step that NVML samples cover.
CREATE OR REPLACE VIEW step_gpu AS
WITH sg AS (
    SELECT s.run_id, s.tid, s.step_idx, s.start_ns, s.end_ns, g.gpu
    FROM _step s, (SELECT DISTINCT gpu FROM _gpu_sample_interval) g
), a AS (
    SELECT sg.*, coalesce(i.sample_idx, 0) AS ka
    FROM sg ASOF LEFT JOIN _gpu_sample_interval i ON sg.gpu = i.gpu AND sg.start_ns >= i.xs
), b AS (
    SELECT a.*, i.sample_idx AS kb
    FROM a ASOF JOIN _gpu_sample_interval i ON a.gpu = i.gpu AND a.end_ns > i.xs
), p AS (
    SELECT run_id, tid, step_idx, start_ns, end_ns, gpu,
           unnest(CASE WHEN ka = kb THEN [ka] ELSE range(ka, kb + 1) END) AS sample_idx
    FROM b WHERE kb >= ka
), o AS (
    SELECT p.run_id, p.tid, p.step_idx, p.gpu, i.sm_clock_mhz, i.clock_event_reasons, i.idle,
           least(i.xe, p.end_ns) - greatest(i.xs, p.start_ns) AS overlap_ns
    FROM p JOIN _gpu_sample_interval i USING (gpu, sample_idx)
    WHERE i.xs < p.end_ns AND p.start_ns < i.xe
), og AS (   -- per step and GPU
    SELECT o.run_id, o.tid, o.step_idx, o.gpu,
           min(o.sm_clock_mhz) AS sm_clock_min_mhz,
           bit_or(o.clock_event_reasons) AS clock_event_reasons,
           coalesce(sum(o.overlap_ns) FILTER (
               NOT o.idle AND o.sm_clock_mhz < prm.gpu_clock_factor * c.reference_sm_clock_mhz), 0)
               AS gpu_clock_ns,
           min(c.reference_sm_clock_mhz) AS reference_sm_clock_mhz,
           count(*) AS samples
    FROM o
    CROSS JOIN step_params prm
    LEFT JOIN gpu_run_clock c ON c.run_id = o.run_id AND c.gpu = o.gpu
    GROUP BY o.run_id, o.tid, o.step_idx, o.gpu
)
SELECT
    run_id,                                                -- run
    tid,                                                   -- step's thread
    step_idx,                                              -- step index on the thread
    min(sm_clock_min_mhz) AS sm_clock_min_mhz,             -- lowest SM clock held during the step, MHz
    bit_or(clock_event_reasons) AS clock_event_reasons,    -- OR of NVML clock-event reasons during the step
    max(gpu_clock_ns)::BIGINT AS gpu_clock_ns,             -- step time under a dropped clock (below gpu_clock_factor x the run's reference, GPU not idle), ns; the worst GPU
    min(reference_sm_clock_mhz) AS reference_sm_clock_mhz, -- the run's reference SM clock, MHz (lowest over GPUs)
    sum(samples) AS samples                                -- samples (all GPUs) held during the step
FROM og
GROUP BY run_id, tid, step_idx;
