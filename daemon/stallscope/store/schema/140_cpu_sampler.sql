-- The CPU sampler (probes/cpu_bcc.py, docs/cpu-sampler.md): what tracked
-- threads ran on CPU, sampled at cpu_sample_hz (default 1 kHz) per thread
-- while on CPU, with Python frames and the native leaf. Off-CPU time is not
-- sampled (offcpu has it). pid is the process (tgid), tid the thread; times
-- CLOCK_MONOTONIC ns. Stacks and frames are stored once and named by id;
-- `coverage` rows (probe 'cpu') say when the sampler covered each run.

-- One row per sample of a tracked thread that was on CPU.
CREATE TABLE IF NOT EXISTS cpu_samples (
    pid         INTEGER,
    tid         INTEGER,
    ts_ns       BIGINT,     -- when the timer fired
    cpu         SMALLINT,   -- the CPU it ran on
    stack_id    BIGINT,     -- cpu_stacks.stack_id; NULL when nothing is known of the code (no frame, no leaf)
    kernel_mode BOOLEAN,    -- the CPU was in the kernel (a system call, a fault); the native leaf is then where the thread entered it
    unwind      VARCHAR,    -- NULL: every Python frame walked; else why not: 'no_tstate', 'tstate_fault', 'no_python' (native leaf only), 'frame_fault' (outer frames lost), 'truncated' (deeper than cpu_max_depth)
    stored_ns   BIGINT DEFAULT getvariable('stallscope_stored_ns')
);

-- One row per frame of each distinct stack: depth 0 is the leaf (the native
-- leaf when there is one, then the innermost Python frame), increasing outwards.
CREATE TABLE IF NOT EXISTS cpu_stacks (
    stack_id    BIGINT,
    depth       SMALLINT,   -- 0 = leaf
    frame_id    BIGINT,     -- cpu_frames.frame_id
    first_ts_ns BIGINT,     -- the batch of samples that first used the stack (retention keeps it while any sample does)
    stored_ns   BIGINT DEFAULT getvariable('stallscope_stored_ns')
);

-- One row per distinct frame.
CREATE TABLE IF NOT EXISTS cpu_frames (
    frame_id    BIGINT,
    kind        VARCHAR,    -- 'py' (a Python function) or 'native' (the machine-code leaf)
    file        VARCHAR,    -- py: the code object's co_filename ('...' + its tail when longer than 256 bytes); native: the module's path; NULL when unknown
    function    VARCHAR,    -- py: co_qualname (3.11+) or co_name (3.10), '<unknown>' when its name never arrived; native: the symbol, NULL when the module has none for it
    line        INTEGER,    -- py: the line executing; NULL for native frames and when the line table was cut
    first_ts_ns BIGINT,     -- the batch of samples that first used the frame
    stored_ns   BIGINT DEFAULT getvariable('stallscope_stored_ns')
);
