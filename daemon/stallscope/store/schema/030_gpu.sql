-- GPU samples, filled by daemon/probes/gpu_nvml.py. ts_ns is CLOCK_MONOTONIC.
-- Two sources share the table so that "the lowest SM clock inside this step"
-- is one query: source = 'poll' rows are the probe's own readings (every field,
-- at settings.gpu_poll_hz); source = 'buffer' rows come from the driver's own
-- sample buffers (nvmlDeviceGetSamples), finer in time but one value each
-- (sm_clock_mhz or power_mw), their driver timestamp calibrated to
-- CLOCK_MONOTONIC (see nvml_clock_sync and docs/gpu-probe.md).
-- A field NVML could not read is NULL; the row is kept.
CREATE TABLE IF NOT EXISTS nvml_samples (
    gpu                 INTEGER,   -- NVML device index
    ts_ns               BIGINT,    -- poll: midpoint of this GPU's reads; buffer: calibrated driver timestamp
    sm_clock_mhz        INTEGER,   -- SM clock (buffer rows: the driver's processor-clock samples)
    mem_clock_mhz       INTEGER,
    power_mw            INTEGER,   -- board power, milliwatts; see power_source
    temp_c              INTEGER,   -- GPU core temperature, degrees C
    util_pct            INTEGER,   -- GPU utilization, 0..100
    clock_event_reasons UBIGINT,   -- raw NVML clock-event-reason bitmask (names: gpu_clock_event_reason_names())
    graphics_clock_mhz  INTEGER,   -- graphics clock
    mem_util_pct        INTEGER,   -- memory-controller utilization, 0..100
    power_source        VARCHAR,   -- 'instant' (field NVML_FI_DEV_POWER_INSTANT), 'average' (nvmlDeviceGetPowerUsage, 1 s mean on Hopper), 'buffer'
    source              VARCHAR,   -- 'poll' or 'buffer'
    raw_ts_us           UBIGINT,   -- driver timestamp, microseconds, undocumented clock (buffer sample; poll: the instant-power field's)
    read_ns             BIGINT,    -- poll: how long this GPU's NVML reads took, nanoseconds
    sync_err_ns         BIGINT     -- buffer: bound on the calibration error of ts_ns, nanoseconds
);

-- One row per calibration of the driver's sample clock to CLOCK_MONOTONIC:
-- monotonic_ns = raw_ts_us * 1000 - offset_ns.
CREATE TABLE IF NOT EXISTS nvml_clock_sync (
    ts_ns        BIGINT,    -- when the calibration was made (CLOCK_MONOTONIC)
    clock        VARCHAR,   -- the driver clock identified: 'realtime', 'boottime', 'monotonic', or 'envelope' (none matched)
    offset_ns    BIGINT,    -- driver clock minus CLOCK_MONOTONIC, nanoseconds
    err_ns       BIGINT,    -- bound on the offset's error, nanoseconds
    lower_ns     BIGINT,    -- envelope bounds on the offset from buffer reads (NULL when unbounded)
    upper_ns     BIGINT,
    observations INTEGER    -- buffer reads the envelope used
);
