-- On-CPU attribution (issue 26): the columns that let step_attribution name
-- the code that made a step slow (`code`: code_frame, code_ns) or show that
-- the same work ran slower (`cpu_slow`: cpu_slow_ns, cpu_slow_evidence).
-- queries/step/11_profile.sql and docs/queries.md say how they are used.

-- The task that held the CPU until a traced thread came back to it (the end
-- of each offcpu row: its switch-in), recorded by the bcc sched program
-- (sched_bcc.h struct record prev_*): whatever ran there while the thread
-- was away, which may have left the caches cold. NULL from the perf and
-- /proc backends, and where the program had not seen that task's own
-- switch-in (it loaded meanwhile).
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS prev_pid INTEGER;     -- its tgid (0: the CPU was idle)
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS prev_comm VARCHAR;    -- its comm
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS prev_run_ns BIGINT;   -- how long it had run on that CPU when the thread got it back, ns

-- The sampling rate of a sampling probe over a coverage row (the CPU
-- sampler's cpu_sample_hz); NULL for the other probes. A step's samples are
-- turned into time with it (rows written before this file: 1,000 Hz).
ALTER TABLE coverage ADD COLUMN IF NOT EXISTS sample_hz DOUBLE;

-- Per filled step (store/step_fill.py, the columns of _step_cpu_of(true)):
-- its CPU samples and who ran on its CPU just before and during it.
ALTER TABLE step_components ADD COLUMN IF NOT EXISTS cpu_samples BIGINT;          -- user-mode samples with every Python frame walked (the profile's samples)
ALTER TABLE step_components ADD COLUMN IF NOT EXISTS cpu_kernel_samples BIGINT;   -- samples taken in kernel mode (never code)
ALTER TABLE step_components ADD COLUMN IF NOT EXISTS cpu_partial_samples BIGINT;  -- user-mode samples whose Python frames were not all walked (left out of the profile)
-- The profile samples by stack: stack_id (cpu_stacks), n samples, of which
-- n_submit inside the step's submit calls. NULL: no sample.
ALTER TABLE step_components ADD COLUMN IF NOT EXISTS cpu_stack_counts STRUCT(stack_id BIGINT, n INTEGER, n_submit INTEGER)[];
ALTER TABLE step_components ADD COLUMN IF NOT EXISTS other_task_ns BIGINT;        -- run time of other processes on the step thread's CPU right before its switch-ins during and just before the step (each at most 10 ms), ns; NULL: none seen
ALTER TABLE step_components ADD COLUMN IF NOT EXISTS other_task STRUCT(pid INTEGER, comm VARCHAR, run_ns BIGINT);  -- the one of them that ran longest
-- The version of the filler's columns a row was written with
-- (vocab.schema.STEP_FILL_VERSION): rows of an older version lack columns
-- added since and are filled again (the filler deletes them at start; the
-- views read a thread's stored rows only at the current version).
ALTER TABLE step_components ADD COLUMN IF NOT EXISTS fill_version INTEGER;
ALTER TABLE step_component_threads ADD COLUMN IF NOT EXISTS fill_version INTEGER;
