-- NVML clock-event-reason bits, decoded by value (the same table as
-- daemon/stallscope/vocab/gpu_reasons.py). nvml_samples.clock_event_reasons keeps the
-- raw mask; use these to name it.
--
--   SELECT ts_ns, gpu_clock_event_reason_names(clock_event_reasons) FROM nvml_samples;
--   SELECT * FROM nvml_samples WHERE gpu_clock_event_is_slowdown(clock_event_reasons);

-- One row per known bit.
CREATE OR REPLACE VIEW gpu_clock_event_reason_bits AS
SELECT * FROM (VALUES
    -- bit: the mask value (UBIGINT); name: short name; slowdown: true when the
    -- bit means the clock is held below what the work asks for
    (1::UBIGINT,    'idle',                false),
    (2::UBIGINT,    'applications_clocks', false),
    (4::UBIGINT,    'sw_power_cap',        true),
    (8::UBIGINT,    'hw_slowdown',         true),
    (16::UBIGINT,   'sync_boost',          true),
    (32::UBIGINT,   'sw_thermal',          true),
    (64::UBIGINT,   'hw_thermal',          true),
    (128::UBIGINT,  'power_brake',         true),
    (256::UBIGINT,  'display_clock',       false),
    (512::UBIGINT,  'board_limit',         true),
    (1024::UBIGINT, 'reliability',         true)
) AS t(bit, name, slowdown);

-- Names of the known bits set in `mask` (lowest first): a list of VARCHAR,
-- empty for 0, NULL for NULL.
CREATE OR REPLACE MACRO gpu_clock_event_reason_names(mask) AS
    CASE WHEN mask IS NULL THEN NULL ELSE coalesce(
        (SELECT list(b.name ORDER BY b.bit) FROM gpu_clock_event_reason_bits b
          WHERE (mask::UBIGINT & b.bit) <> 0), []::VARCHAR[]) END;

-- True when any bit of `mask` means a slowdown (mask & 0x6FC); NULL for NULL.
CREATE OR REPLACE MACRO gpu_clock_event_is_slowdown(mask) AS
    (mask::UBIGINT & 1788::UBIGINT) <> 0;
