-- Per-step attribution components kept by the daemon as steps close
-- (store/step_fill.py), so that step_attribution reads them instead of
-- joining every kernel row with every step on each query. The views
-- (queries/step/) use a row only while it still matches its step and was
-- computed with the session's step_lock_chain_gap_ns; every other step is
-- computed as before, from the source tables. Nothing but the daemon's
-- filler writes these tables; deleting their rows only makes queries slower.

-- One row per filled step: the columns of _step_components and
-- _step_submit_call for it (NULL where the step has none).
CREATE TABLE IF NOT EXISTS step_components (
    run_id              BIGINT,
    tid                 BIGINT,
    step_idx            BIGINT,      -- _step.step_idx when filled
    pid                 INTEGER,     -- _step.pid when filled
    start_ns            BIGINT,      -- the step's span, CLOCK_MONOTONIC ns
    end_ns              BIGINT,
    has_components      BOOLEAN,     -- some source row overlaps the step (_step_components has a row)
    submit_ns           BIGINT,      -- _step_submit_call columns (NULL: no submit call)
    submit_start_ns     BIGINT,
    submit_end_ns       BIGINT,
    submit_calls        BIGINT,
    gc_ns               BIGINT,      -- _step_components columns, same meaning and units
    gc0_ns              BIGINT,
    gc1_ns              BIGINT,
    gc2_ns              BIGINT,
    gc_passes           BIGINT,
    gc_generation       TINYINT,
    gc_collected        BIGINT,
    gc_in_submit_ns     BIGINT,
    preempted_raw_ns    BIGINT,
    blocked_raw_ns      BIGINT,
    runq_raw_ns         BIGINT,
    migrations          BIGINT,
    offcpu_intervals    BIGINT,
    offcpu_in_submit_ns BIGINT,
    preemption_ns       BIGINT,
    throttled_ns        BIGINT,
    lock_ns             BIGINT,
    peer_ns             BIGINT,
    blocked_woken_ns    BIGINT,
    blocked_unsplit_ns  BIGINT,
    runqueue_woken_ns   BIGINT,
    page_faults         BIGINT,
    page_fault_raw_ns   BIGINT,
    irq_raw_ns          BIGINT,
    preemptor           STRUCT(pid INTEGER, tid INTEGER, comm VARCHAR, run_id BIGINT),
    waker               STRUCT(pid INTEGER, tid INTEGER, comm VARCHAR, run_id BIGINT),
    syscall_total_ns    BIGINT,
    top_syscall         VARCHAR,
    who_pids            INTEGER[],   -- processes named as preemptor or waker by any off-CPU row of the step
    lock_chain_gap_ns   BIGINT,      -- step_params.lock_chain_gap_ns the row was computed with
    filled_ns           BIGINT       -- daemon's CLOCK_MONOTONIC ns when the row was written
);

-- One row per step thread the filler has seen: how far its steps are filled.
-- The filled steps of a thread are always its steps 0..filled_idx.
CREATE TABLE IF NOT EXISTS step_component_threads (
    run_id            BIGINT,
    tid               BIGINT,
    pid               INTEGER,   -- _step.pid when written
    filled_idx        BIGINT,    -- last filled step_idx (-1: none yet)
    todo_from_ns      BIGINT,    -- no unfilled step of the thread starts before this, ns
    chain_cut_ns      BIGINT,    -- off-CPU rows of the thread from here on are enough to compute its
                                 -- unfilled steps (a lock-chain boundary), ns
    safe_ns           BIGINT,    -- a row of the thread starting at or after this cannot change its filled steps, ns
    lock_chain_gap_ns BIGINT,    -- step_params.lock_chain_gap_ns the rows were computed with
    updated_ns        BIGINT     -- daemon's CLOCK_MONOTONIC ns of the last change
);
