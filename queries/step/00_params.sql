-- Parameters of the step rules. DuckDB views take no arguments, so each
-- parameter is a session variable with a default; change one for the
-- current connection with, e.g.:
--     SET VARIABLE step_slow_factor = 1.5;
-- and every step_* and seed_* view follows. RESET VARIABLE restores it.
-- The defaults are mirrored, one name for one name, by
-- daemon/stallscope/vocab/rules.py (the live alerts, `top` and the
-- report use that module); a test checks that the two agree.

-- The effective parameters, one row.
CREATE OR REPLACE VIEW step_params AS
SELECT
    -- A step is slow when duration_ns > slow_factor x baseline_ns (ratio; 1.2 = 20% above).
    coalesce(getvariable('step_slow_factor'), 1.2)::DOUBLE              AS slow_factor,
    -- A component becomes the cause when it explains at least this share of the excess (0..1).
    coalesce(getvariable('step_cause_min_share'), 0.5)::DOUBLE          AS cause_min_share,
    -- Time charged to each migration inside a step when sizing the 'migration'
    -- component (nanoseconds; a cache-cold restart on another CPU).
    coalesce(getvariable('step_migration_cost_ns'), 50000)::BIGINT     AS migration_cost_ns,
    -- An NVML sample counts as a GPU clock drop when its SM clock is below
    -- this fraction of the run's reference clock (0..1) and the GPU is not idle.
    coalesce(getvariable('step_gpu_clock_factor'), 0.9)::DOUBLE         AS gpu_clock_factor,
    -- An NVML sample stands for at most this long after its timestamp
    -- (nanoseconds); past it, a step has no GPU data rather than a stale sample.
    coalesce(getvariable('step_gpu_sample_hold_ns'), 1000000000)::BIGINT AS gpu_sample_hold_ns,
    -- Only this NVML device index is joined with steps; NULL = every GPU.
    getvariable('step_gpu')::INTEGER                                     AS gpu,
    -- Steps at least this long count as long in seed_runs (nanoseconds).
    coalesce(getvariable('seed_long_step_ns'), 100000000)::BIGINT       AS long_step_ns,
    -- The stage name of prompt processing: such steps are not stalls in the
    -- seed tables (seed_gen2.in_prefill, seed_runs.long_non_prefill). An
    -- engine without stages has no prefill step; every step of it counts.
    coalesce(getvariable('step_prefill_stage'), 'prefill')::VARCHAR     AS prefill_stage,
    -- A baseline group (same run, stage and batch; or same run, stage and
    -- work bucket) needs at least this many non-idle steps; smaller groups
    -- fall back (see step_baseline).
    coalesce(getvariable('step_baseline_min_steps'), 5)::BIGINT         AS baseline_min_steps,
    -- Work buckets per doubling of spans.work (4: buckets about 19% wide).
    coalesce(getvariable('step_work_buckets_per_octave'), 4)::DOUBLE    AS work_buckets_per_octave,
    -- A blocked interval that ended by a timer or interrupt belongs to the
    -- lock wait that follows it when the thread blocks again within this
    -- long (nanoseconds): a GIL waiter times out every switch interval,
    -- runs a few microseconds, and waits again until the holder wakes it.
    coalesce(getvariable('step_lock_chain_gap_ns'), 50000)::BIGINT      AS lock_chain_gap_ns,
    -- a CUDA sync that returned within this of its thread's return to a CPU
    -- after a preemption may have been done while the thread was off CPU: that
    -- preemption stays preemption; earlier ones (the thread then waited on)
    -- are GPU wait. Nanoseconds; ~50 us pass from a switch-in to the sync's
    -- return on a loaded VM. step_components keep the value they were filled with.
    coalesce(getvariable('step_cuda_sync_tail_ns'), 500000)::BIGINT    AS cuda_sync_tail_ns,
    -- A step waited for a span of another process of its run group (a
    -- peer span: step_attribution.peer_*) when that span started inside the
    -- step and the step ended at most peer_end_gap_ns (nanoseconds) plus
    -- peer_end_gap_share (0..1) of the peer's time inside the step after
    -- it ended: a poller that waited long backs off (vLLM's shared-memory
    -- queue sleeps between polls) or loses its CPU meanwhile, so it notices
    -- a long peer span's end later.
    coalesce(getvariable('step_peer_end_gap_ns'), 1000000)::BIGINT      AS peer_end_gap_ns,
    coalesce(getvariable('step_peer_end_gap_share'), 0.1)::DOUBLE       AS peer_end_gap_share,
    -- A frame of a step's CPU profile holds more than its baseline share of
    -- the step's samples when a one-sided test rejects at this many standard
    -- deviations (4.265: level 1e-5 per frame, so under 0.1% per step of up
    -- to 100 frames; see step_profile and the `code` cause).
    coalesce(getvariable('step_code_z'), 4.265)::DOUBLE                 AS code_z,
    -- `cpu_slow` needs the samples to have had at least this chance (0..1)
    -- of finding a localized excess of half the step's excess...
    coalesce(getvariable('step_cpu_slow_power'), 0.9)::DOUBLE           AS cpu_slow_power,
    -- ... in a frame holding this share (0..1) of a normal step's samples
    -- (a larger frame that grows looks like a slower CPU: docs/queries.md).
    coalesce(getvariable('step_cpu_slow_ref_share'), 0.1)::DOUBLE       AS cpu_slow_ref_share;
