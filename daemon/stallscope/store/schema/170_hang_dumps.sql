-- The hang watchdog (issue 30, docs/hang.md): a run whose steps stopped
-- ending while it had work (its last step was not idle) for longer than its
-- threshold, and every thread of its process as the watchdog found it, read
-- without stopping it (/proc/PID/task, /proc/PID/mem; the CPU sampler's last
-- stack for a thread it saw on CPU). Times are CLOCK_MONOTONIC ns.

-- One row per no-progress episode (one dump at most per episode).
CREATE TABLE IF NOT EXISTS hang_dumps (
    dump_id          BIGINT,     -- unique id (counted from the wall clock at the daemon's start)
    run_id           BIGINT,
    pid              INTEGER,    -- the run's process (SO_PEERCRED)
    detected_ns      BIGINT,     -- when the watchdog saw the threshold passed
    reason           VARCHAR,    -- a sentence: how long with no step end, the threshold and how it was chosen
    threshold_ns     BIGINT,     -- the threshold that applied, ns
    last_step_end_ns BIGINT,     -- end of the last step before the episode
    recovered_ns     BIGINT,     -- end of the first step after it; NULL while hung, or when the run left hung
    threads          INTEGER,    -- threads in the dump (0: no dump taken, see lacks)
    capture_ns       BIGINT,     -- the capture's own duration, ns (the process ran on meanwhile)
    lacks            VARCHAR,    -- what the dump is missing and why (NULL: nothing): rate limit, no layout, ...
    stored_ns        BIGINT DEFAULT getvariable('stallscope_stored_ns')
);

-- One row per frame of each thread of a dump (depth 0 = innermost); a thread
-- with no known frame has one row with depth 0 and frame_id NULL.
CREATE TABLE IF NOT EXISTS hang_dump_frames (
    dump_id     BIGINT,      -- hang_dumps.dump_id
    run_id      BIGINT,      -- the dump's run (rows go with it)
    pid         INTEGER,     -- the thread's process: the dump's, or another process of its run group
    tid         INTEGER,     -- kernel thread id
    thread_name VARCHAR,     -- the kernel's name of the thread (/proc/PID/task/TID/comm)
    state       VARCHAR,     -- kernel run state at capture: R running, S sleeping, D disk sleep, T stopped, Z zombie
    wchan       VARCHAR,     -- kernel function the thread sleeps in (NULL when running or hidden)
    syscall     INTEGER,     -- system call number it is blocked in (NULL: none, or running)
    cpu_ns      BIGINT,      -- the thread's CPU time so far, ns (clock-tick resolution)
    source      VARCHAR,     -- where the frames came from: 'sampler' (its last on-CPU stack), 'proc_mem' (/proc/PID/mem), 'none'
    walk        VARCHAR,     -- NULL: walked to the outermost frame; else why it stopped: 'mem_fault', 'truncated', 'loop'
    depth       SMALLINT,    -- 0 = innermost
    frame_id    BIGINT,      -- cpu_frames.frame_id (NULL: nothing known)
    stored_ns   BIGINT DEFAULT getvariable('stallscope_stored_ns')
);
