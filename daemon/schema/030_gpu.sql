-- GPU samples, filled by daemon/probes/gpu_nvml.py. ts_ns is CLOCK_MONOTONIC.
CREATE TABLE IF NOT EXISTS nvml_samples (
    gpu                 INTEGER,   -- NVML device index
    ts_ns               BIGINT,
    sm_clock_mhz        INTEGER,
    mem_clock_mhz       INTEGER,
    power_mw            INTEGER,
    temp_c              INTEGER,
    util_pct            INTEGER,   -- GPU utilization, 0..100
    clock_event_reasons UBIGINT    -- raw NVML clock-event-reason bitmask
);
