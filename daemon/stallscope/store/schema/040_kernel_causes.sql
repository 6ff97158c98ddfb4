-- Kernel causes inside a step: who took the CPU, who woke the thread,
-- system calls, page faults, IRQ and steal time. Filled by the kernel-cause
-- probes (daemon/stallscope/probes/); read by queries/step/. pid is the
-- process (tgid), tid the thread; times CLOCK_MONOTONIC ns. A probe that was
-- not running leaves its table empty for that time: `coverage` says when each
-- probe covered each run, so a view can tell "none happened" (0) from "not
-- looked at" (NULL).

-- Who: for a preempted interval the task switched in (sched_switch next_*);
-- for a blocked interval the thread that woke ours (sched_waking from task
-- context). NULL when unknown, and waker_* NULL when the wakeup came from an
-- interrupt or a timer (not a thread): then waker_irq is true.
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS preemptor_pid INTEGER;   -- tgid of the task that took the CPU
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS preemptor_tid INTEGER;   -- its thread id
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS preemptor_comm VARCHAR;  -- its comm (16 bytes max)
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS waker_pid INTEGER;       -- tgid of the waking thread
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS waker_tid INTEGER;       -- the waking thread
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS waker_comm VARCHAR;      -- its comm
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS waker_irq BOOLEAN;       -- woken from interrupt/timer context
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS wakeup_ns BIGINT;        -- when it was woken (blocked part ends, run-queue wait begins)
-- A preempted interval that began inside sched_yield(): the thread gave its
-- CPU away itself (a spinning waiter), so the task switched in did not
-- preempt it; the views count the interval as run-queue wait, never as
-- `preemption`. `preempted` stays true, as the kernel counts it (nivcsw).
-- NULL: not known (the perf and /proc backends, an architecture other than
-- x86-64, a kernel before 5.15).
ALTER TABLE offcpu ADD COLUMN IF NOT EXISTS yielded BOOLEAN;

-- System calls of tracked threads (an expensive probe: only in a diagnosis
-- window or with `daemon --deep`). A call of at least the probe's threshold
-- is one exact row (count = 1, [start_ns, end_ns] its entry and exit); shorter
-- calls are summed in the kernel per (thread, syscall) and flushed as one row
-- per interval: [start_ns, end_ns] is then that interval, count the calls in
-- it and total_ns their summed time (read such rows as totals).
CREATE TABLE IF NOT EXISTS syscalls (
    pid       INTEGER,
    tid       INTEGER,
    nr        INTEGER,   -- syscall number (x86-64)
    name      VARCHAR,   -- its name, e.g. ioctl, futex
    start_ns  BIGINT,
    end_ns    BIGINT,
    count     INTEGER,   -- calls in the row (1 = exact interval)
    total_ns  BIGINT     -- time inside the calls, ns (= end_ns - start_ns when count = 1)
);

-- User page faults of tracked threads, summed in the kernel per thread and
-- interval. The tracepoint has no end event: cost_ns is their time measured in
-- the faulting thread (146_page_fault_time.sql; before it, count x a per-fault
-- cost the daemon calibrated at start).
CREATE TABLE IF NOT EXISTS page_faults (
    pid      INTEGER,
    tid      INTEGER,
    start_ns BIGINT,     -- interval the faults fell in
    end_ns   BIGINT,
    count    INTEGER,    -- faults in the interval
    cost_ns  BIGINT      -- their time, ns (measured and estimated: cost_method)
);

-- Hard and soft IRQ time taken from a tracked thread while it was on a CPU
-- (irq:irq_handler_entry/exit, irq:softirq_entry/exit with the interrupted
-- task current).
CREATE TABLE IF NOT EXISTS irq_time (
    pid      INTEGER,
    tid      INTEGER,
    cpu      SMALLINT,
    start_ns BIGINT,
    end_ns   BIGINT,
    kind     VARCHAR,    -- 'hardirq' or 'softirq'
    vec      INTEGER     -- IRQ number or softirq vector
);

-- Hypervisor steal time per CPU (the guest's steal clock), per interval.
CREATE TABLE IF NOT EXISTS steal (
    cpu      SMALLINT,
    start_ns BIGINT,
    end_ns   BIGINT,
    steal_ns BIGINT      -- steal inside [start_ns, end_ns], ns
);

-- When each probe covered each run: components of a step outside its probe's
-- coverage are NULL, not 0, and such a slow step's cause is 'uncovered'.
CREATE TABLE IF NOT EXISTS coverage (
    run_id   BIGINT,
    probe    VARCHAR,    -- 'sched', 'syscalls', 'page_faults', 'irq', 'steal', 'gpu'
    start_ns BIGINT,
    end_ns   BIGINT      -- NULL while still covering
);
