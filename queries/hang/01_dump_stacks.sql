-- The hang watchdog's dumps (docs/hang.md), frame by frame with names.
-- hang_dump_frames names frames by cpu_frames.frame_id (the CPU sampler's
-- frame dictionary, which the watchdog's own frames join too).

-- One row per frame of each thread of each dump (a thread with no known
-- frame: one row, depth 0, function NULL).
CREATE OR REPLACE VIEW hang_dump_stacks AS
SELECT d.dump_id,                    -- hang_dumps.dump_id
    d.run_id,                        -- run
    d.pid,                           -- the hung run's process
    f.pid AS thread_pid,             -- the thread's process: pid, or another process of the run group
    d.detected_ns,                   -- when the hang was seen, CLOCK_MONOTONIC ns
    d.recovered_ns,                  -- first step end after it, ns; NULL while hung or when the run left hung
    f.tid,                           -- kernel thread id
    f.thread_name,                   -- kernel name of the thread
    f.state,                         -- kernel run state at capture (R, S, D, ...)
    f.wchan,                         -- kernel function it sleeps in; NULL when running
    f.syscall,                       -- system call number it is blocked in; NULL when none
    f.source,                        -- 'sampler' (last on-CPU stack), 'proc_mem' (/proc/PID/mem) or 'none'
    f.depth,                         -- 0 = innermost frame
    c.kind,                          -- 'py' or 'native' (the sampler's native leaf)
    c.function,                      -- Python qualname, or native symbol; NULL when unknown
    c.file,                          -- source file, or native module path
    c.line                           -- line executing; NULL when unknown
FROM hang_dump_frames f
JOIN hang_dumps d USING (dump_id)
LEFT JOIN cpu_frames c ON c.frame_id = f.frame_id;
