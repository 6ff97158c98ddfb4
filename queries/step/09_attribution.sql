-- Step attribution: for every step, what took its time, and for slow steps
-- the cause. docs/queries.md has the same rules as a table, with every
-- component's blind spots.
--
-- Rules (parameters in step_params; SET VARIABLE to change them):
--   idle        spans.idle, or batch 0 on a thread that reports batch sizes
--               (see _step): never slow, no baseline, no cause.
--   slow        not idle and duration_ns > slow_factor (1.2) x baseline_ns
--               (step_baseline / _step_base: the median of comparable
--               steps of the run; baseline_model says which).
--   excess_ns   duration_ns - baseline_ns (negative for fast steps).
--   components  disjoint parts of the step's wall time, ns, taken in this
--               order (an earlier one keeps time a later one also claims):
--     gc          GC passes of the run (any thread) overlapping the step;
--                 a wait that a GC pass overlaps is GC, whoever waits
--     gpu_wait    host time in CUDA synchronisations and polling loops
--                 (cuda_sync_ns), asleep or spinning, less the time held
--                 off a CPU inside them when the GPU may have been done (the
--                 run-queue wait after a sync's wake-up, a preemption the
--                 sync ended right after, cuda_sync_tail_ns: those stay
--                 runqueue and preemption), above the median of that over
--                 the run's non-idle steps of the same stage and batch; the
--                 other off-CPU time inside exact syncs is taken out of the
--                 blocked, lock, peer, preemption and throttled parts below
--                 (a sleeping sync is never 'blocked'); sync time under a
--                 dropped GPU clock is gpu_clock
--     off CPU (the step thread's off-CPU intervals, less their GC time and
--     their time inside CUDA syncs):
--     lock        asleep until another thread of the same process woke it
--                 (a timed-out wait chained to such a wake-up too)
--     peer        asleep until a thread of another traced process woke it
--     runqueue    runnable after a wake-up, waiting for a CPU (runq_ns)
--     throttled   preempted while the CPU then ran nothing (a CPU quota)
--     preemption  preempted (involuntary switch-out) otherwise (preempted_ns)
--     blocked     asleep for any other reason: timer, I/O, device, an
--                 untraced process, or an unknown waker (blocked_ns)
--     on CPU (each capped by what the ones before left of the step's time
--     outside GC, off-CPU and CUDA sync time):
--     irq         hard/soft IRQ handlers run on the thread's CPU while it
--                 was current (irq_time), less GC time
--     steal       hypervisor steal on the thread's CPU, pro-rated
--     page_fault  time of the step's user page faults, measured in the thread
--                 (page_faults.cost_ns, pro-rated; docs/kernel-causes.md)
--     syscall     time inside system calls less the voluntary off-CPU time
--                 of the step (syscall time while on CPU, estimated)
--     migration   migrations x migration_cost_ns (50 us)
--     launch      host time in CUDA launch calls (cuda_launch_ns) above the
--                 median of the run's non-idle steps of the same stage and
--                 batch (a launch storm, a full launch queue)
--     submit      submit_excess_ns less GC and off-CPU time inside submit,
--                 and less the gpu_wait and launch parts
--     gpu_clock   step time under an SM clock below gpu_clock_factor (0.9)
--                 x the run's reference clock while the GPU was not idle
--   coverage    a component whose probe did not cover the step is NULL,
--               not 0. A probe covers a step when a step_coverage interval
--               of the run holds the whole step. A run with no coverage
--               row for the sched probe is covered by it (the sched tables
--               are read as complete, as before coverage existed); a run
--               with no row for another probe never ran it: its components
--               are NULL, and that alone does not make a step 'uncovered'.
--   cause       NULL unless slow; else the largest component, if it is > 0
--               and at least cause_min_share (0.5) x excess_ns (ties: the
--               order above); else 'uncovered' when a probe that covered
--               the run at other times missed this step; else
--               'unexplained'.

-- One row per step.
CREATE OR REPLACE VIEW step_attribution AS
WITH f AS MATERIALIZED (SELECT * FROM _step_base),
p AS (SELECT * FROM step_params),
cov_run AS (   -- which probes ever covered each run
    SELECT run_id,
        bool_or(probe = 'sched') AS sched, bool_or(probe = 'syscalls') AS syscalls,
        bool_or(probe = 'page_faults') AS page_faults, bool_or(probe = 'irq') AS irq,
        bool_or(probe = 'steal') AS steal, bool_or(probe = 'cuda') AS cuda
    FROM coverage GROUP BY run_id
), cov_step AS ( -- which probes covered each step
    SELECT f.run_id, f.tid, f.step_idx,
        bool_or(c.probe = 'sched') AS sched, bool_or(c.probe = 'syscalls') AS syscalls,
        bool_or(c.probe = 'page_faults') AS page_faults, bool_or(c.probe = 'irq') AS irq,
        bool_or(c.probe = 'steal') AS steal, bool_or(c.probe = 'cuda') AS cuda
    FROM f JOIN step_coverage c
      ON c.run_id = f.run_id AND c.start_ns <= f.start_ns AND c.end_ns >= f.end_ns
    GROUP BY ALL
), st AS (     -- steal intervals overlapping steps, pro-rated
    SELECT f.run_id, f.pid, f.tid, f.step_idx, f.start_ns, f.end_ns, s.cpu,
           s.steal_ns * (least(s.end_ns, f.end_ns) - greatest(s.start_ns, f.start_ns))
               / (s.end_ns - s.start_ns) AS part_ns
    FROM f JOIN steal s
      ON s.steal_ns > 0 AND s.end_ns > s.start_ns AND s.start_ns < f.end_ns AND f.start_ns < s.end_ns
), st_cpu AS (  -- the step thread's CPU: where its first switch-out in or after the step left from
    SELECT c.run_id, c.tid, c.step_idx, arg_min(o.cpu, o.start_ns) AS cpu
    FROM (SELECT DISTINCT run_id, pid, tid, step_idx, start_ns, end_ns FROM st) c
    JOIN offcpu o ON o.pid = c.pid AND o.tid = c.tid AND o.resolution_ns IS NULL
                 AND o.start_ns >= c.start_ns AND o.start_ns < c.end_ns + 1000000000
    GROUP BY ALL
), stl AS (
    SELECT st.run_id, st.tid, st.step_idx, round(sum(st.part_ns))::BIGINT AS steal_ns
    FROM st JOIN st_cpu k USING (run_id, tid, step_idx)
    WHERE st.cpu = k.cpu GROUP BY ALL
), j AS (
    SELECT
        f.run_id, f.tid, f.step_idx, f.stage, f.batch, f.start_ns, f.end_ns, f.duration_ns,
        f.baseline_ns, f.baseline_model, f.idle, f.work,
        f.duration_ns - f.baseline_ns AS excess_ns,
        coalesce(c.gc_ns, 0) AS gc_ns,
        c.gc_generation,
        f.submit_ns,
        coalesce(greatest(f.submit_ns - f.submit_baseline_ns, 0), 0) AS submit_excess_ns,
        gp.sm_clock_min_mhz,
        gp.clock_event_reasons,
        coalesce(gp.gpu_clock_ns, 0) AS gpu_clock_raw_ns,
        greatest(coalesce(greatest(f.submit_ns - f.submit_baseline_ns, 0), 0)
                 - coalesce(c.gc_in_submit_ns, 0) - coalesce(c.offcpu_in_submit_ns, 0), 0) AS submit_raw_ns,
        NOT f.idle AND f.duration_ns > p.slow_factor * f.baseline_ns AS slow,
        p.cause_min_share, p.migration_cost_ns,
        -- coverage: sched counts as covering a run that has no sched coverage row
        coalesce(cs.sched, false) OR NOT coalesce(cr.sched, false) AS sched_cov,
        coalesce(cs.syscalls, false) AS syscalls_cov,
        coalesce(cs.page_faults, false) AS page_faults_cov,
        coalesce(cs.irq, false) AS irq_cov,
        coalesce(cs.steal, false) AS steal_cov,
        coalesce(cs.cuda, false) AS cuda_cov,
        list_filter(['sched', 'syscalls', 'page_faults', 'irq', 'steal', 'cuda'],
            lambda q: CASE q WHEN 'sched' THEN coalesce(cr.sched, false) AND NOT coalesce(cs.sched, false)
                             WHEN 'syscalls' THEN coalesce(cr.syscalls, false) AND NOT coalesce(cs.syscalls, false)
                             WHEN 'page_faults' THEN coalesce(cr.page_faults, false) AND NOT coalesce(cs.page_faults, false)
                             WHEN 'irq' THEN coalesce(cr.irq, false) AND NOT coalesce(cs.irq, false)
                             WHEN 'cuda' THEN coalesce(cr.cuda, false) AND NOT coalesce(cs.cuda, false)
                             ELSE coalesce(cr.steal, false) AND NOT coalesce(cs.steal, false) END) AS uncovered_probes,
        c.lock_ns AS c_lock_ns, c.peer_ns AS c_peer_ns, c.runqueue_woken_ns, c.blocked_woken_ns,
        c.blocked_unsplit_ns, c.preemption_ns AS c_preemption_ns, c.throttled_ns AS c_throttled_ns,
        c.preempted_raw_ns, c.blocked_raw_ns, c.runq_raw_ns, c.migrations AS c_migrations,
        c.preemptor, c.waker, c.syscall_total_ns AS c_syscall_total_ns, c.top_syscall AS c_top_syscall,
        c.page_faults AS c_page_faults, c.page_fault_raw_ns, c.irq_raw_ns, stl.steal_ns AS c_steal_ns,
        c.cuda_launch_ns AS c_cuda_launch_ns, c.cuda_launches AS c_cuda_launches,
        c.cuda_sync_ns AS c_cuda_sync_ns, c.cuda_sync_off_ns AS c_cuda_sync_off_ns,
        c.cuda_sync_held_ns AS c_cuda_sync_held_ns,
        c.cuda_copy_ns AS c_cuda_copy_ns
    FROM f
    CROSS JOIN p
    LEFT JOIN _step_components c ON c.run_id = f.run_id AND c.tid = f.tid AND c.step_idx = f.step_idx
    LEFT JOIN step_gpu gp ON gp.run_id = f.run_id AND gp.tid = f.tid AND gp.step_idx = f.step_idx
    LEFT JOIN cov_run cr ON cr.run_id = f.run_id
    LEFT JOIN cov_step cs ON cs.run_id = f.run_id AND cs.tid = f.tid AND cs.step_idx = f.step_idx
    LEFT JOIN stl ON stl.run_id = f.run_id AND stl.tid = f.tid AND stl.step_idx = f.step_idx
), k AS (      -- off-CPU parts (run-queue wait without a recorded wake-up time: from runq rows)
    SELECT j.*,
        least(coalesce(blocked_unsplit_ns, 0),
              greatest(0, coalesce(runq_raw_ns, 0) - coalesce(preempted_raw_ns, 0))) AS rq_fallback_ns
    FROM j
), o AS (
    SELECT k.*,
        CASE WHEN sched_cov THEN coalesce(c_lock_ns, 0) END AS lock_ns,
        CASE WHEN sched_cov THEN coalesce(c_peer_ns, 0) END AS peer_ns,
        CASE WHEN sched_cov THEN coalesce(runqueue_woken_ns, 0) + rq_fallback_ns END AS runq_ns,
        CASE WHEN sched_cov THEN coalesce(c_throttled_ns, 0) END AS throttled_ns,
        CASE WHEN sched_cov THEN coalesce(c_preemption_ns, 0) END AS preempted_ns,
        CASE WHEN sched_cov THEN coalesce(blocked_woken_ns, 0) + coalesce(blocked_unsplit_ns, 0)
                                 - rq_fallback_ns END AS blocked_ns,
        CASE WHEN sched_cov THEN coalesce(c_migrations, 0) END AS migrations
    FROM k
), cb AS (     -- CUDA baselines: medians of the run's non-idle covered steps of the same stage and batch
    SELECT run_id, stage, batch,
        median(coalesce(c_cuda_sync_ns, 0) - coalesce(c_cuda_sync_held_ns, 0)) FILTER (cuda_cov)
            AS cuda_sync_baseline_ns,
        median(coalesce(c_cuda_launch_ns, 0)) FILTER (cuda_cov) AS cuda_launch_baseline_ns
    FROM o WHERE NOT idle GROUP BY ALL
), w AS (      -- gpu_wait, and the off-CPU time inside syncs the off-CPU parts give up
    SELECT o.*, cb.cuda_sync_baseline_ns, cb.cuda_launch_baseline_ns,
        CASE WHEN cuda_cov THEN coalesce(c_cuda_sync_ns, 0) END AS sync_raw,
        CASE WHEN cuda_cov THEN coalesce(c_cuda_sync_held_ns, 0) ELSE 0 END AS sync_held,
        CASE WHEN cuda_cov THEN least(coalesce(c_cuda_sync_off_ns, 0), coalesce(c_cuda_sync_ns, 0))
             ELSE 0 END AS so,
        CASE WHEN cuda_cov THEN greatest(0, least(coalesce(c_cuda_sync_ns, 0) - coalesce(c_cuda_sync_held_ns, 0)
                 - coalesce(cb.cuda_sync_baseline_ns, 0), duration_ns - gc_ns))::BIGINT END AS gpu_wait_raw,
        CASE WHEN cuda_cov THEN greatest(0, coalesce(c_cuda_launch_ns, 0)
                 - coalesce(cb.cuda_launch_baseline_ns, 0))::BIGINT END AS launch_raw
    FROM o
    LEFT JOIN cb ON cb.run_id = o.run_id AND cb.stage IS NOT DISTINCT FROM o.stage AND cb.batch = o.batch
), w1 AS (
    SELECT w.*, least(coalesce(blocked_ns, 0), so) AS t_b FROM w
), w2 AS (
    SELECT w1.*, least(coalesce(lock_ns, 0), so - t_b) AS t_l FROM w1
), w3 AS (
    SELECT w2.*, least(coalesce(peer_ns, 0), so - t_b - t_l) AS t_p FROM w2
), w4 AS (
    SELECT w3.*, least(coalesce(preempted_ns, 0), so - t_b - t_l - t_p) AS t_pre FROM w3
), w5 AS (
    SELECT w4.*, least(coalesce(throttled_ns, 0), so - t_b - t_l - t_p - t_pre) AS t_th FROM w4
), v AS (      -- the off-CPU parts less their GPU-wait time; gpu_wait under a dropped clock is gpu_clock
    SELECT w5.* REPLACE (
            blocked_ns - t_b AS blocked_ns, lock_ns - t_l AS lock_ns, peer_ns - t_p AS peer_ns,
            preempted_ns - t_pre AS preempted_ns, throttled_ns - t_th AS throttled_ns,
            greatest(submit_raw_ns - coalesce(gpu_wait_raw, 0) - coalesce(launch_raw, 0), 0) AS submit_raw_ns),
        CASE WHEN gpu_clock_raw_ns > 0 THEN least(coalesce(gpu_wait_raw, 0), gpu_clock_raw_ns) ELSE 0 END
            AS gpu_wait_clock_ns
    FROM w5
), r AS (      -- on-CPU raw parts, and the time they may share: the wall time
               -- outside GC and the off-CPU parts
    SELECT v.*,
        CASE WHEN gpu_wait_raw IS NOT NULL THEN gpu_wait_raw - gpu_wait_clock_ns END AS gpu_wait_ns,
        greatest(0, duration_ns - gc_ns - coalesce(lock_ns, 0) - coalesce(peer_ns, 0) - coalesce(runq_ns, 0)
                 - coalesce(throttled_ns, 0) - coalesce(preempted_ns, 0) - coalesce(blocked_ns, 0)
                 - (coalesce(sync_raw, 0) - sync_held)) AS room_ns,
        CASE WHEN irq_cov THEN coalesce(irq_raw_ns, 0) END AS irq_raw,
        CASE WHEN steal_cov THEN coalesce(c_steal_ns, 0) END AS steal_raw,
        CASE WHEN page_faults_cov THEN coalesce(page_fault_raw_ns, 0) END AS page_fault_raw,
        CASE WHEN syscalls_cov THEN   -- time in syscalls less the voluntary off-CPU time
            greatest(0, coalesce(c_syscall_total_ns, 0) - coalesce(blocked_raw_ns, 0)) END AS syscall_raw,
        migrations * migration_cost_ns AS migration_raw
    FROM v
), q AS (      -- running totals in precedence order (NULL parts count 0)
    SELECT r.*,
        coalesce(irq_raw, 0) AS p1,
        coalesce(irq_raw, 0) + coalesce(steal_raw, 0) AS p2,
        coalesce(irq_raw, 0) + coalesce(steal_raw, 0) + coalesce(page_fault_raw, 0) AS p3,
        coalesce(irq_raw, 0) + coalesce(steal_raw, 0) + coalesce(page_fault_raw, 0)
            + coalesce(syscall_raw, 0) AS p4,
        coalesce(irq_raw, 0) + coalesce(steal_raw, 0) + coalesce(page_fault_raw, 0)
            + coalesce(syscall_raw, 0) + coalesce(migration_raw, 0) AS p5,
        coalesce(irq_raw, 0) + coalesce(steal_raw, 0) + coalesce(page_fault_raw, 0)
            + coalesce(syscall_raw, 0) + coalesce(migration_raw, 0) + coalesce(launch_raw, 0) AS p6,
        coalesce(irq_raw, 0) + coalesce(steal_raw, 0) + coalesce(page_fault_raw, 0)
            + coalesce(syscall_raw, 0) + coalesce(migration_raw, 0) + coalesce(launch_raw, 0)
            + submit_raw_ns AS p7,
        coalesce(irq_raw, 0) + coalesce(steal_raw, 0) + coalesce(page_fault_raw, 0)
            + coalesce(syscall_raw, 0) + coalesce(migration_raw, 0) + coalesce(launch_raw, 0)
            + submit_raw_ns + gpu_clock_raw_ns AS p8
    FROM r
), c AS (      -- each on-CPU part capped by what the earlier ones left of room_ns:
               -- least(p_k, room) - least(p_k-1, room)
    SELECT q.*,
        CASE WHEN irq_raw IS NOT NULL THEN least(p1, room_ns) END AS irq_ns,
        CASE WHEN steal_raw IS NOT NULL THEN least(p2, room_ns) - least(p1, room_ns) END AS steal_ns,
        CASE WHEN page_fault_raw IS NOT NULL THEN least(p3, room_ns) - least(p2, room_ns) END AS page_fault_ns,
        CASE WHEN syscall_raw IS NOT NULL THEN least(p4, room_ns) - least(p3, room_ns) END AS syscall_ns,
        CASE WHEN migration_raw IS NOT NULL THEN least(p5, room_ns) - least(p4, room_ns) END AS migration_ns,
        CASE WHEN launch_raw IS NOT NULL THEN least(p6, room_ns) - least(p5, room_ns) END AS launch_ns,
        least(p7, room_ns) - least(p6, room_ns) AS submit_host_ns,
        least(p8, room_ns) - least(p7, room_ns) + gpu_wait_clock_ns AS gpu_clock_ns
    FROM q
), m AS (
    SELECT c.*,
        greatest(gc_ns, coalesce(gpu_wait_ns, 0), coalesce(lock_ns, 0), coalesce(peer_ns, 0), coalesce(runq_ns, 0),
                 coalesce(throttled_ns, 0), coalesce(preempted_ns, 0), coalesce(blocked_ns, 0),
                 coalesce(irq_ns, 0), coalesce(steal_ns, 0), coalesce(page_fault_ns, 0),
                 coalesce(syscall_ns, 0), coalesce(migration_ns, 0), coalesce(launch_ns, 0),
                 submit_host_ns, gpu_clock_ns) AS top_ns
    FROM c
)
SELECT
    run_id,               -- run (runs.run_id)
    tid,                  -- native thread id of the step
    step_idx,             -- index of the step on its thread, 0-based, in start order
    stage,                -- step's stage, or NULL
    batch,                -- step's batch size, 0 if unknown
    start_ns,             -- CLOCK_MONOTONIC ns
    end_ns,               -- CLOCK_MONOTONIC ns
    duration_ns,          -- end_ns - start_ns, ns
    baseline_ns,          -- what a normal step like it takes (baseline_model), ns; NULL for idle steps
    excess_ns,            -- duration_ns - baseline_ns, ns (negative when faster; NULL for idle steps)
    gc_ns,                -- GC time inside the step (any thread of the run), ns
    gc_generation,        -- generation of the GC pass with the most time in the step, NULL if none
    preempted_ns,         -- preempted time (involuntary switch-outs, not throttled), net of GC, ns; NULL outside sched coverage
    blocked_ns,           -- asleep for no lock/peer reason, net of GC and run-queue wait, ns; NULL outside sched coverage
    runq_ns,              -- run-queue wait after wake-ups (CPU contention), net of GC, ns; NULL outside sched coverage
    migrations,           -- CPU migrations inside the step; NULL outside sched coverage
    submit_ns,            -- host time inside submit calls, ns (NULL when none)
    submit_excess_ns,     -- submit_ns above its baseline (step_submit), ns, >= 0
    sm_clock_min_mhz,     -- lowest SM clock during the step, MHz (NULL without NVML samples)
    clock_event_reasons,  -- OR of NVML clock-event reasons during the step (NULL without samples)
    gpu_clock_ns,         -- step time under a dropped SM clock, capped by the on-CPU time left, ns
    migration_ns,         -- migrations x migration_cost_ns, capped by the on-CPU time left, ns
    submit_host_ns,       -- submit component: submit_excess_ns less GC and off-CPU time inside submit, capped, ns
    slow,                 -- not idle and duration_ns > slow_factor x baseline_ns
    CASE
        WHEN NOT slow THEN NULL
        WHEN top_ns > 0 AND top_ns >= cause_min_share * excess_ns THEN
            CASE top_ns
                WHEN gc_ns THEN 'gc'
                WHEN gpu_wait_ns THEN 'gpu_wait'
                WHEN lock_ns THEN 'lock'
                WHEN peer_ns THEN 'peer'
                WHEN runq_ns THEN 'runqueue'
                WHEN throttled_ns THEN 'throttled'
                WHEN preempted_ns THEN 'preemption'
                WHEN blocked_ns THEN 'blocked'
                WHEN irq_ns THEN 'irq'
                WHEN steal_ns THEN 'steal'
                WHEN page_fault_ns THEN 'page_fault'
                WHEN syscall_ns THEN 'syscall'
                WHEN migration_ns THEN 'migration'
                WHEN launch_ns THEN 'launch'
                WHEN submit_host_ns THEN 'submit'
                ELSE 'gpu_clock'
            END
        WHEN len(uncovered_probes) > 0 THEN 'uncovered'
        ELSE 'unexplained'
    END AS cause,         -- NULL (not slow), or one of the causes above, 'uncovered' or 'unexplained'
    CASE WHEN slow THEN top_ns END AS cause_ns,  -- slow steps: size of the largest component, ns
    idle,                 -- idle step (batch 0 on a thread that reports batches, or marked idle)
    work,                 -- the user's work measure (spans.work), NULL if none
    baseline_model,       -- 'batch', 'stage', 'work_bucket' or 'work_fit' (step_baseline); NULL for idle steps
    lock_ns,              -- asleep until another thread of the process woke it, net of GC, ns; NULL outside sched coverage
    peer_ns,              -- asleep until a thread of another traced process woke it, net of GC, ns
    throttled_ns,         -- preempted while the CPU then ran nothing (CPU quota), net of GC, ns
    irq_ns,               -- IRQ time on the thread's CPU while it ran, ns; NULL outside irq coverage
    steal_ns,             -- hypervisor steal on the thread's CPU, pro-rated, ns; NULL outside steal coverage
    CASE WHEN page_faults_cov THEN coalesce(c_page_faults, 0) END AS page_faults,  -- user page faults (pro-rated); NULL outside coverage
    page_fault_ns,        -- their time (page_faults.cost_ns, pro-rated), capped by the on-CPU time left, ns; NULL outside page_faults coverage
    syscall_ns,           -- time in system calls while on CPU (estimated), ns; NULL outside syscalls coverage
    CASE WHEN syscalls_cov THEN coalesce(c_syscall_total_ns, 0) END AS syscall_total_ns,  -- time in system calls, on or off CPU, ns
    CASE WHEN syscalls_cov THEN c_top_syscall END AS top_syscall,  -- the syscall with the most time in the step (on or off CPU)
    CASE WHEN sched_cov THEN preemptor.pid END AS preemptor_pid,    -- tgid of the task holding the CPU for most of the preempted time (0: idle)
    CASE WHEN sched_cov THEN preemptor.comm END AS preemptor_comm,  -- its comm
    CASE WHEN sched_cov THEN preemptor.run_id END AS preemptor_run_id,  -- its run, when it is a traced process
    CASE WHEN sched_cov THEN waker.tid END AS waker_tid,            -- the thread the step waited on for most of its sleep (its wake-ups, and timed-out waits chained to them; NULL: timer, interrupt, unknown)
    CASE WHEN sched_cov THEN waker.comm END AS waker_comm,          -- its comm
    CASE WHEN sched_cov THEN waker.pid END AS waker_pid,            -- its process
    CASE WHEN sched_cov THEN waker.run_id END AS waker_run_id,      -- its run, when it is a traced process
    uncovered_probes,     -- probes that covered the run at some time but not this step
    gpu_wait_ns,          -- cuda_sync_ns less its run-queue and preempted time, above its baseline, capped by the step's time outside GC, less its part under a dropped GPU clock, ns; NULL outside cuda coverage
    launch_ns,            -- cuda_launch_ns above its baseline, capped by the on-CPU time left, ns; NULL outside cuda coverage
    sync_raw AS cuda_sync_ns,  -- host time in CUDA synchronisations and polling loops (asleep or spinning), ns; NULL outside cuda coverage
    cuda_sync_baseline_ns,     -- median of cuda_sync_ns less its run-queue and preempted time over the run's non-idle covered steps of the same stage and batch, ns
    CASE WHEN cuda_cov THEN coalesce(c_cuda_launch_ns, 0) END AS cuda_launch_ns,  -- host time in CUDA launch calls, ns; NULL outside cuda coverage
    CASE WHEN cuda_cov THEN coalesce(c_cuda_launches, 0) END AS cuda_launches,    -- CUDA launch calls (summary rows pro-rated); NULL outside cuda coverage
    CASE WHEN cuda_cov THEN coalesce(c_cuda_copy_ns, 0) END AS cuda_copy_ns       -- host time in CUDA memory copies, ns; NULL outside cuda coverage
FROM m;
