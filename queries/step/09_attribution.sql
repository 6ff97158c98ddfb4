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
--     peer        asleep until a thread of another traced process woke it,
--                 or inside the late peer span of its run group (o2 below)
--     lock        asleep until another thread of the same process woke it
--                 (a timed-out wait chained to such a wake-up too)
--     runqueue    runnable after a wake-up, or after giving the CPU away in
--                 sched_yield() (offcpu.yielded), waiting for a CPU (runq_ns)
--     throttled   preempted while the CPU then ran nothing (a CPU quota)
--     preemption  preempted (involuntary switch-out, not a yield) otherwise (preempted_ns)
--     blocked     asleep for any other reason: timer, I/O, device, an
--                 untraced process, or an unknown waker (blocked_ns)
--     on CPU (each capped by what the ones before left of the step's time
--     outside GC, off-CPU and CUDA sync time):
--     irq         hard/soft IRQ handlers run on the thread's CPU while it
--                 was current (irq_time), less GC time
--     steal       hypervisor steal on the thread's CPU, pro-rated
--     page_fault  time of the step's user page faults, measured in the thread
--                 (page_faults.cost_ns, pro-rated; docs/kernel-causes.md);
--                 under the CPU sampler at most what its kernel-mode samples allow
--     syscall     time inside system calls less the voluntary off-CPU time
--                 of the step (syscall time while on CPU, estimated)
--     migration   migrations x migration_cost_ns (50 us)
--     launch      host time in CUDA launch calls (cuda_launch_ns) above the
--                 median of the run's non-idle steps of the same stage and
--                 batch (a launch storm, a full launch queue)
--     code        (slow steps) the largest localized excess of the step's CPU
--                 profile (step_profile: a frame holding more of the step's
--                 own samples than its share of the baseline steps' samples,
--                 significant at code_z), samples x the sampling period;
--                 code_frame: the deepest such frame holding at least half of it
--     submit      submit_excess_ns less GC and off-CPU time inside submit,
--                 less the gpu_wait and launch parts, and less the code
--                 excess found inside submit
--     gpu_clock   step time under an SM clock below gpu_clock_factor (0.9)
--                 x the run's reference clock while the GPU was not idle
--     cpu_slow    (slow steps no earlier component names) the step's on-CPU
--                 time above what its baseline steps spend on CPU, only when
--                 the samples had cpu_slow_power (0.9) chance of finding a
--                 localized excess of half the excess in a frame holding
--                 cpu_slow_ref_share (0.1) of a normal step (the step's own
--                 samples, or those of its group's open slow steps together)
--                 and found none, and some evidence says the CPU gave less
--                 (cpu_slow_evidence: other_task, steal, band)
--   groups      the baseline group of a step (its profile's baseline): the
--               run, stage and batch (baseline_model 'batch'), work bucket
--               ('work_bucket'), else the stage ('stage', 'work_fit'); its
--               normal steps are the non-idle, non-slow ones the CPU sampler
--               covered, and a group needs baseline_min_steps of them
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
WITH RECURSIVE f AS MATERIALIZED (SELECT * FROM _step_base),
p AS (SELECT * FROM step_params),
cov_run AS (   -- which probes ever covered each run
    SELECT run_id,
        bool_or(probe = 'sched') AS sched, bool_or(probe = 'syscalls') AS syscalls,
        bool_or(probe = 'page_faults') AS page_faults, bool_or(probe = 'irq') AS irq,
        bool_or(probe = 'steal') AS steal, bool_or(probe = 'cuda') AS cuda,
        bool_or(probe = 'cpu') AS cpu
    FROM coverage GROUP BY run_id
), cov_step AS ( -- which probes covered each step
    SELECT f.run_id, f.tid, f.step_idx,
        bool_or(c.probe = 'sched') AS sched, bool_or(c.probe = 'syscalls') AS syscalls,
        bool_or(c.probe = 'page_faults') AS page_faults, bool_or(c.probe = 'irq') AS irq,
        bool_or(c.probe = 'steal') AS steal, bool_or(c.probe = 'cuda') AS cuda,
        bool_or(c.probe = 'cpu') AS cpu
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
), j AS MATERIALIZED (
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
        p.cause_min_share, p.migration_cost_ns, p.peer_end_gap_ns, p.peer_end_gap_share,
        p.baseline_min_steps, p.code_z,
        p.cpu_slow_power AS cpu_slow_power_min, p.cpu_slow_ref_share,
        -- the step's baseline group (its profile's baseline: see `groups`)
        coalesce('s:' || f.stage, 'n') || '|' || CASE f.baseline_model
            WHEN 'batch' THEN 'b' || f.batch
            WHEN 'work_bucket' THEN 'w' || floor(log2(1 + f.work) * p.work_buckets_per_octave)::BIGINT
            ELSE 's' END AS gkey,
        coalesce(cs.cpu, false) AS cpu_cov,
        CASE WHEN coalesce(cs.cpu, false) THEN coalesce(cp.cpu_samples, 0) END AS cpu_n,
        CASE WHEN coalesce(cs.cpu, false) THEN coalesce(cp.cpu_kernel_samples, 0) END AS cpu_kernel_n,
        cp.other_task_ns AS c_other_task_ns, cp.other_task AS c_other_task,
        coalesce(pr.period_ns, 1000000) AS period_ns,
        -- coverage: sched counts as covering a run that has no sched coverage row
        coalesce(cs.sched, false) OR NOT coalesce(cr.sched, false) AS sched_cov,
        coalesce(cs.syscalls, false) AS syscalls_cov,
        coalesce(cs.page_faults, false) AS page_faults_cov,
        coalesce(cs.irq, false) AS irq_cov,
        coalesce(cs.steal, false) AS steal_cov,
        coalesce(cs.cuda, false) AS cuda_cov,
        list_filter(['sched', 'syscalls', 'page_faults', 'irq', 'steal', 'cuda', 'cpu'],
            lambda q: CASE q WHEN 'sched' THEN coalesce(cr.sched, false) AND NOT coalesce(cs.sched, false)
                             WHEN 'syscalls' THEN coalesce(cr.syscalls, false) AND NOT coalesce(cs.syscalls, false)
                             WHEN 'page_faults' THEN coalesce(cr.page_faults, false) AND NOT coalesce(cs.page_faults, false)
                             WHEN 'irq' THEN coalesce(cr.irq, false) AND NOT coalesce(cs.irq, false)
                             WHEN 'cuda' THEN coalesce(cr.cuda, false) AND NOT coalesce(cs.cuda, false)
                             WHEN 'steal' THEN coalesce(cr.steal, false) AND NOT coalesce(cs.steal, false)
                             ELSE coalesce(cr.cpu, false) AND NOT coalesce(cs.cpu, false) END) AS uncovered_probes,
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
    LEFT JOIN _step_cpu cp ON cp.run_id = f.run_id AND cp.tid = f.tid AND cp.step_idx = f.step_idx
    LEFT JOIN _cpu_period pr ON pr.run_id = f.run_id
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
), grp AS (    -- runs of run groups with more than one run (runs.group_key)
    SELECT run_id, group_key FROM runs WHERE group_key IS NOT NULL
    QUALIFY count(*) OVER (PARTITION BY group_key) > 1
), gj AS MATERIALIZED (  -- their steps
    SELECT j.run_id, j.tid, j.step_idx, j.start_ns, j.end_ns, j.slow, j.excess_ns, j.peer_end_gap_ns,
           j.peer_end_gap_share, g.group_key
    FROM j JOIN grp g USING (run_id)
), gb AS (     -- bucket size of the join (only a join device)
    SELECT greatest(coalesce(avg(end_ns - start_ns), 0)::BIGINT, 1000000) AS bucket_ns FROM gj
), gcov AS (   -- one row per (grouped step, bucket its span touches)
    SELECT gj.*, unnest(range(gj.start_ns // b.bucket_ns,
                              greatest(gj.end_ns - 1, gj.start_ns) // b.bucket_ns + 1)) AS bucket
    FROM gj CROSS JOIN gb b
), gstart AS (  -- each grouped step with the bucket of its start (a plain
                -- column, so the join below hashes on it: an expression
                -- there left only group_key as the hash key, quadratic in a
                -- group's steps)
    SELECT gj.*, gj.start_ns // b.bucket_ns AS start_bucket FROM gj CROSS JOIN gb b
), pp AS (     -- steps of another run of the group that start inside the step and end by its end
    SELECT s.run_id, s.tid, s.step_idx, s.end_ns AS s_end_ns, s.peer_end_gap_ns, s.peer_end_gap_share,
           p.run_id AS p_run_id, p.tid AS p_tid, p.step_idx AS p_step_idx,
           p.start_ns AS p_start_ns, p.end_ns AS p_end_ns, p.slow AS p_slow, p.excess_ns AS p_excess_ns
    FROM gcov s
    JOIN gstart p ON p.group_key = s.group_key AND p.start_bucket = s.bucket
             AND p.run_id <> s.run_id
             AND p.start_ns > s.start_ns AND p.start_ns < s.end_ns
    WHERE p.end_ns <= s.end_ns
), pt AS (     -- per step and peer thread (a rank): its spans inside the step
    SELECT run_id, tid, step_idx, p_run_id, p_tid, any_value(s_end_ns) AS s_end_ns,
        any_value(peer_end_gap_ns) AS peer_end_gap_ns, any_value(peer_end_gap_share) AS peer_end_gap_share,
        max(p_end_ns) AS last_end_ns,
        sum(p_end_ns - p_start_ns) AS overlap_ns,
        coalesce(sum(greatest(p_excess_ns, 0)) FILTER (p_slow), 0) AS slow_excess_ns,
        -- the peer span: its slow span with the most excess, else its last
        arg_max(p_step_idx, (p_slow, CASE WHEN p_slow THEN p_excess_ns ELSE 0 END, p_end_ns)) AS p_step_idx
    FROM pp GROUP BY run_id, tid, step_idx, p_run_id, p_tid
), pl AS (     -- per step: the late peer (the one that finished last), and by how
               -- much; the step waited for it when it ended within
               -- peer_end_gap_ns (+ peer_end_gap_share of its time) of the step's end
    SELECT run_id, tid, step_idx, count(*) AS peers,
        arg_max({'run_id': p_run_id, 'tid': p_tid, 'step_idx': p_step_idx, 'overlap_ns': overlap_ns,
                 'excess_ns': slow_excess_ns}, (last_end_ns, p_run_id, p_tid)) AS late,
        CASE WHEN count(*) > 1 THEN max(last_end_ns) - list_sort(list(last_end_ns), 'DESC')[2] END
            AS peer_late_ns
    FROM pt GROUP BY ALL
    HAVING any_value(s_end_ns) - max(last_end_ns)
           <= any_value(peer_end_gap_ns) + any_value(peer_end_gap_share) * arg_max(overlap_ns, last_end_ns)
), o2 AS (     -- the matched peer's time: the step waited inside the late peer's
               -- span while that span ran over its own baseline (slept or spun);
               -- it goes before the later waits, which give up the same share
    SELECT o.* EXCLUDE (lock_ns, peer_ns, runq_ns, throttled_ns, preempted_ns, blocked_ns),
        pl.peers, pl.late, pl.peer_late_ns, x.old_peer_ns, x.match_ns,
        CASE WHEN x.peer_ns IS NOT NULL THEN round(o.lock_ns * x.keep)::BIGINT END AS lock_ns,
        x.peer_ns,
        round(o.runq_ns * x.keep)::BIGINT AS runq_ns,
        round(o.throttled_ns * x.keep)::BIGINT AS throttled_ns,
        round(o.preempted_ns * x.keep)::BIGINT AS preempted_ns,
        round(o.blocked_ns * x.keep)::BIGINT AS blocked_ns
    FROM o
    LEFT JOIN pl USING (run_id, tid, step_idx)
    CROSS JOIN LATERAL (
        SELECT y.*,
            CASE WHEN y.peer_ns IS NULL OR y.peer_ns <= y.old_peer_ns THEN 1.0
                 ELSE greatest(0.0, 1.0 - (y.peer_ns - y.old_peer_ns)
                                    / greatest(1, o.duration_ns - o.gc_ns - y.old_peer_ns)) END AS keep
        FROM (SELECT z.*,
                CASE WHEN o.sched_cov OR z.match_ns > 0 THEN greatest(z.old_peer_ns, z.match_ns) END AS peer_ns
              FROM (SELECT coalesce(o.peer_ns, 0) AS old_peer_ns,
                           least(coalesce(CASE WHEN pl.late.excess_ns > 0 THEN
                                     least(pl.late.excess_ns, pl.late.overlap_ns) END, 0),
                                 greatest(0, o.duration_ns - o.gc_ns)) AS match_ns) z) y
    ) x
), cb AS (     -- CUDA baselines: medians of the run's non-idle covered steps of the same stage and batch
    SELECT run_id, stage, batch,
        median(coalesce(c_cuda_sync_ns, 0) - coalesce(c_cuda_sync_held_ns, 0)) FILTER (cuda_cov)
            AS cuda_sync_baseline_ns,
        median(coalesce(c_cuda_launch_ns, 0)) FILTER (cuda_cov) AS cuda_launch_baseline_ns
    FROM o2 WHERE NOT idle GROUP BY ALL
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
    FROM o2 o
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
), r AS MATERIALIZED (  -- on-CPU raw parts, and the time they may share: the wall time
               -- outside GC and the off-CPU parts
    SELECT v.*,
        CASE WHEN gpu_wait_raw IS NOT NULL THEN gpu_wait_raw - gpu_wait_clock_ns END AS gpu_wait_ns,
        greatest(0, duration_ns - gc_ns - coalesce(lock_ns, 0) - coalesce(peer_ns, 0) - coalesce(runq_ns, 0)
                 - coalesce(throttled_ns, 0) - coalesce(preempted_ns, 0) - coalesce(blocked_ns, 0)
                 - (coalesce(sync_raw, 0) - sync_held)) AS room_ns,
        CASE WHEN irq_cov THEN coalesce(irq_raw_ns, 0) END AS irq_raw,
        CASE WHEN steal_cov THEN coalesce(c_steal_ns, 0) END AS steal_raw,
        -- a fault's measured time runs to the thread's next fault, so user work
        -- between faults counts too (a C call that allocates as it goes, such
        -- as zlib.compress, would be all page_fault): where the CPU sampler
        -- covered the step, capped by its kernel-mode samples' 99 % upper
        -- bound (k + 3 sqrt(k) + 3 samples), the time it can have spent in the kernel
        CASE WHEN page_faults_cov THEN
            CASE WHEN cpu_cov THEN least(coalesce(page_fault_raw_ns, 0),
                                         round((cpu_kernel_n + 3 * sqrt(cpu_kernel_n) + 3) * period_ns)::BIGINT)
                 ELSE coalesce(page_fault_raw_ns, 0) END
        END AS page_fault_raw,
        CASE WHEN syscalls_cov THEN   -- time in syscalls less the voluntary off-CPU time
            greatest(0, coalesce(c_syscall_total_ns, 0) - coalesce(blocked_raw_ns, 0)) END AS syscall_raw,
        migrations * migration_cost_ns AS migration_raw
    FROM v
), pg AS MATERIALIZED (  -- each baseline group's normal steps the CPU sampler covered
    SELECT run_id, gkey, count(*) AS steps, sum(cpu_n) AS s_n,
           sum(duration_ns) AS s_dur, sum(room_ns) AS s_room
    FROM r WHERE cpu_cov AND NOT slow AND NOT idle AND baseline_ns > 0
    GROUP BY run_id, gkey
), nd AS MATERIALIZED (  -- the profile nodes of every step
    SELECT * FROM _step_cpu_node
), pn AS MATERIALIZED (  -- their profile samples per node
    SELECT r.run_id, r.gkey, n.node, sum(n.samples) AS s_node
    FROM r JOIN nd n ON n.run_id = r.run_id AND n.tid = r.tid AND n.step_idx = r.step_idx
    WHERE r.cpu_cov AND NOT r.slow AND NOT r.idle AND r.baseline_ns > 0
    GROUP BY r.run_id, r.gkey, n.node
), sv AS MATERIALIZED (  -- every node of every slow step of a usable group: its baseline share
                         -- (0.5 of a sample added: a node never seen has a small, not a
                         -- zero, share), localized excess (samples beyond that share of the
                         -- step's own samples) and test
    SELECT x.*, x.samples - x.cpu_n * x.share AS loc,
           CASE WHEN x.samples - x.cpu_n * x.share >= 1   -- (the test only where it can matter)
                THEN _cpu_excess_significant(x.samples, x.cpu_n, x.share, x.code_z) ELSE false END AS sig
    FROM (
        SELECT rs.run_id, rs.tid, rs.step_idx, rs.gkey, n.node, n.level, n.node_kind, n.frame_id,
               n.py_frame_id, n.samples, n.samples_in_submit, rs.cpu_n, rs.excess_ns, rs.period_ns,
               rs.code_z, (coalesce(pn.s_node, 0) + 0.5) / (rs.s_n + 1) AS share
        FROM (SELECT r.run_id, r.tid, r.step_idx, r.gkey, r.cpu_n, r.excess_ns, r.period_ns,
                     r.code_z, pg.s_n
              FROM r JOIN pg ON pg.run_id = r.run_id AND pg.gkey = r.gkey
              WHERE r.slow AND r.cpu_cov AND pg.steps >= r.baseline_min_steps) rs
        JOIN nd n ON n.run_id = rs.run_id AND n.tid = rs.tid AND n.step_idx = rs.step_idx
        LEFT JOIN pn ON pn.run_id = rs.run_id AND pn.gkey = rs.gkey AND pn.node = n.node
    ) x
), cd AS (     -- per slow step: its largest significant localized excess (samples), and
               -- whether there is one at all (then the step did other work, not the
               -- same work slower: never cpu_slow; the power below is this test's)
    SELECT run_id, tid, step_idx, max(loc) FILTER (sig) AS max_loc,
           coalesce(bool_or(sig), false) AS found
    FROM sv GROUP BY run_id, tid, step_idx
), cf AS (     -- the deepest significant node holding at least half of it (ties: the larger)
    SELECT sv.run_id, sv.tid, sv.step_idx,
           arg_max({'kind': sv.node_kind, 'frame_id': sv.frame_id, 'py_frame_id': sv.py_frame_id,
                    'samples': sv.samples, 'in_submit': sv.samples_in_submit},
                   (sv.level, sv.loc)) AS frame
    FROM sv JOIN cd ON cd.run_id = sv.run_id AND cd.tid = sv.tid AND cd.step_idx = sv.step_idx
    WHERE sv.sig AND sv.loc >= 0.5 * cd.max_loc
    GROUP BY sv.run_id, sv.tid, sv.step_idx
), rc AS (
    SELECT r.*,
        CASE WHEN r.slow AND r.cpu_cov THEN round(coalesce(cd.max_loc, 0) * r.period_ns)::BIGINT END AS code_raw,
        -- the part of it inside the submit calls (the frame's samples there)
        coalesce(round(cd.max_loc * r.period_ns * cf.frame.in_submit / nullif(cf.frame.samples, 0)), 0)::BIGINT
            AS code_in_submit_raw,
        cd.found AS code_found, cf.frame AS code_frame_of,
        pg.steps AS group_steps, pg.s_room / nullif(pg.s_dur, 0) AS group_oncpu_share
    FROM r
    LEFT JOIN cd ON cd.run_id = r.run_id AND cd.tid = r.tid AND cd.step_idx = r.step_idx
    LEFT JOIN cf ON cf.run_id = r.run_id AND cf.tid = r.tid AND cf.step_idx = r.step_idx
    LEFT JOIN pg ON pg.run_id = r.run_id AND pg.gkey = r.gkey
), q AS (      -- running totals in precedence order (NULL parts count 0)
    SELECT rc.*,
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
            + coalesce(code_raw, 0) AS p7,
        coalesce(irq_raw, 0) + coalesce(steal_raw, 0) + coalesce(page_fault_raw, 0)
            + coalesce(syscall_raw, 0) + coalesce(migration_raw, 0) + coalesce(launch_raw, 0)
            + coalesce(code_raw, 0) + greatest(submit_raw_ns - code_in_submit_raw, 0) AS p8,
        coalesce(irq_raw, 0) + coalesce(steal_raw, 0) + coalesce(page_fault_raw, 0)
            + coalesce(syscall_raw, 0) + coalesce(migration_raw, 0) + coalesce(launch_raw, 0)
            + coalesce(code_raw, 0) + greatest(submit_raw_ns - code_in_submit_raw, 0)
            + gpu_clock_raw_ns AS p9
    FROM rc
), c AS (      -- each on-CPU part capped by what the earlier ones left of room_ns:
               -- least(p_k, room) - least(p_k-1, room)
    SELECT q.*,
        CASE WHEN irq_raw IS NOT NULL THEN least(p1, room_ns) END AS irq_ns,
        CASE WHEN steal_raw IS NOT NULL THEN least(p2, room_ns) - least(p1, room_ns) END AS steal_ns,
        CASE WHEN page_fault_raw IS NOT NULL THEN least(p3, room_ns) - least(p2, room_ns) END AS page_fault_ns,
        CASE WHEN syscall_raw IS NOT NULL THEN least(p4, room_ns) - least(p3, room_ns) END AS syscall_ns,
        CASE WHEN migration_raw IS NOT NULL THEN least(p5, room_ns) - least(p4, room_ns) END AS migration_ns,
        CASE WHEN launch_raw IS NOT NULL THEN least(p6, room_ns) - least(p5, room_ns) END AS launch_ns,
        CASE WHEN code_raw IS NOT NULL THEN least(p7, room_ns) - least(p6, room_ns) END AS code_ns,
        least(p8, room_ns) - least(p7, room_ns) AS submit_host_ns,
        least(p9, room_ns) - least(p8, room_ns) + gpu_wait_clock_ns AS gpu_clock_ns
    FROM q
), m0 AS MATERIALIZED (  -- the largest part before cpu_slow; `open`: a slow step none of them names
    SELECT c.*, t.top0_ns,
        slow AND NOT (t.top0_ns > 0 AND t.top0_ns >= cause_min_share * excess_ns) AS open
    FROM c, LATERAL (SELECT greatest(gc_ns, coalesce(gpu_wait_ns, 0), coalesce(peer_ns, 0), coalesce(lock_ns, 0), coalesce(runq_ns, 0),
                 coalesce(throttled_ns, 0), coalesce(preempted_ns, 0), coalesce(blocked_ns, 0),
                 coalesce(irq_ns, 0), coalesce(steal_ns, 0), coalesce(page_fault_ns, 0),
                 coalesce(syscall_ns, 0), coalesce(migration_ns, 0), coalesce(launch_ns, 0), coalesce(code_ns, 0),
                 submit_host_ns, gpu_clock_ns) AS top0_ns) t
), pop AS MATERIALIZED (  -- each group's open slow steps as one population
    SELECT m0.run_id, m0.gkey, sum(m0.cpu_n) AS n_pop, sum(m0.excess_ns) AS excess_pop,
           count(*) AS steps, any_value(m0.period_ns) AS period_ns,
           any_value(m0.code_z) AS code_z
    FROM m0 WHERE m0.open AND m0.cpu_cov AND m0.group_steps >= m0.baseline_min_steps
    GROUP BY m0.run_id, m0.gkey
), popf AS (   -- whether a node holds a localized excess of the population, significantly
    SELECT x.run_id, x.gkey,
           bool_or(CASE WHEN x.n - pop.n_pop * x.share >= 1
                        THEN _cpu_excess_significant(x.n, pop.n_pop, x.share, pop.code_z) ELSE false END) AS found
    FROM (SELECT sv.run_id, sv.gkey, sv.node, sum(sv.samples) AS n, any_value(sv.share) AS share
          FROM sv JOIN m0 ON m0.run_id = sv.run_id AND m0.tid = sv.tid AND m0.step_idx = sv.step_idx
          WHERE m0.open GROUP BY sv.run_id, sv.gkey, sv.node) x
    JOIN pop ON pop.run_id = x.run_id AND pop.gkey = x.gkey
    GROUP BY x.run_id, x.gkey
), bs AS MATERIALIZED (  -- steps per whole second of start time and group: how many
                         -- were longer than their baseline (host-wide: every run)
    SELECT start_ns // 1000000000 AS sec, run_id, tid, gkey, count(*) AS n,
           count(*) FILTER (duration_ns > baseline_ns) AS up
    FROM j WHERE NOT idle AND baseline_ns > 0
    GROUP BY ALL
), band AS (   -- the other steps (other groups, threads, runs) within 1 s either side
    SELECT w.run_id, w.tid, w.step_idx, sum(t.n) - coalesce(sum(o.n), 0) AS m,
           sum(t.up) - coalesce(sum(o.up), 0) AS up
    FROM (SELECT run_id, tid, step_idx, gkey, start_ns // 1000000000 + d AS sec
          FROM m0, unnest([-1, 0, 1]) u(d) WHERE open) w
    JOIN (SELECT sec, sum(n) AS n, sum(up) AS up FROM bs GROUP BY sec) t ON t.sec = w.sec
    LEFT JOIN bs o ON o.sec = w.sec AND o.run_id = w.run_id AND o.tid = w.tid AND o.gkey = w.gkey
    GROUP BY w.run_id, w.tid, w.step_idx
), ev AS (     -- the cpu_slow test of each open step
    SELECT m0.*,
        CASE WHEN m0.open THEN coalesce(c_other_task_ns, 0) > 0 END AS ev_other,
        CASE WHEN m0.open AND band.m >= 10 AND (2 * band.up - band.m - 1) / sqrt(band.m) >= 2.326
             THEN round(band.up / band.m, 4) END AS band_share,
        CASE WHEN m0.open AND band.m >= 10 AND (2 * band.up - band.m - 1) / sqrt(band.m) >= 2.326
             THEN band.m::BIGINT END AS band_steps,
        CASE WHEN m0.open AND m0.cpu_cov AND m0.group_steps >= m0.baseline_min_steps THEN
            _cpu_power_p1(m0.cpu_n, 0.5 * m0.excess_ns / m0.period_ns, m0.cpu_slow_ref_share)
        END AS p1_step,
        CASE WHEN m0.open AND m0.cpu_cov AND m0.group_steps >= m0.baseline_min_steps THEN
            _cpu_power_p1(pop.n_pop, 0.5 * pop.excess_pop / pop.period_ns, m0.cpu_slow_ref_share)
        END AS p1_pop,
        pop.n_pop,
        coalesce(popf.found, false) AS pop_found
    FROM m0
    LEFT JOIN band ON band.run_id = m0.run_id AND band.tid = m0.tid AND band.step_idx = m0.step_idx
    LEFT JOIN pop ON pop.run_id = m0.run_id AND pop.gkey = m0.gkey
    LEFT JOIN popf ON popf.run_id = m0.run_id AND popf.gkey = m0.gkey
), evz AS (   -- the power, from the z-score of the test under a localized excess of half the excess
    SELECT ev.*,
        _cpu_power_z(cpu_n, p1_step, cpu_slow_ref_share, code_z) AS z_step,
        _cpu_power_z(n_pop, p1_pop, cpu_slow_ref_share, code_z) AS z_pop
    FROM ev
), evp AS (
    SELECT evz.*, _phi(z_step) AS power_step, _phi(z_pop) AS power_pop FROM evz
), g AS (
    SELECT evp.*,
        CASE WHEN open THEN nullif(list_filter(['other_task', 'steal', 'band'],
            lambda e: CASE e WHEN 'other_task' THEN ev_other
                             WHEN 'steal' THEN coalesce(steal_ns, 0) > 0
                             ELSE band_share IS NOT NULL END), []) END AS cpu_slow_evidence,
        CASE
            WHEN NOT open THEN NULL
            WHEN NOT cpu_cov OR NOT coalesce(group_steps >= baseline_min_steps, false) THEN 'few_samples'
            WHEN coalesce(code_found, false) THEN 'localized_excess'
            WHEN coalesce(power_step >= cpu_slow_power_min, false) THEN 'passed'
            WHEN coalesce(power_pop >= cpu_slow_power_min, false) AND NOT pop_found THEN 'passed'
            WHEN coalesce(power_pop >= cpu_slow_power_min, false) THEN 'localized_excess'
            ELSE 'few_samples'
        END AS samples_test
    FROM evp
), h AS (
    SELECT g.*,
        CASE
            WHEN samples_test IS NULL THEN NULL
            WHEN samples_test <> 'passed' THEN samples_test
            WHEN cpu_slow_evidence IS NULL THEN 'no_evidence'
            ELSE 'cpu_slow'
        END AS cpu_slow_test,
        -- the on-CPU time above what the group's normal steps spend on CPU
        CASE WHEN samples_test = 'passed' AND cpu_slow_evidence IS NOT NULL THEN
            greatest(0, room_ns - round(baseline_ns * group_oncpu_share))::BIGINT END AS cpu_slow_raw
    FROM g
), m AS (
    SELECT h.*,
        CASE WHEN slow AND cpu_cov THEN
            (least(p9 + coalesce(cpu_slow_raw, 0), room_ns) - least(p9, room_ns))::BIGINT END AS cpu_slow_ns,
        greatest(top0_ns, coalesce(least(p9 + coalesce(cpu_slow_raw, 0), room_ns) - least(p9, room_ns), 0))
            AS top_ns
    FROM h
), core AS MATERIALIZED (
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
                WHEN peer_ns THEN 'peer'
                WHEN lock_ns THEN 'lock'
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
                WHEN code_ns THEN 'code'
                WHEN submit_host_ns THEN 'submit'
                WHEN gpu_clock_ns THEN 'gpu_clock'
                ELSE 'cpu_slow'
            END
        WHEN len(uncovered_probes) > 0 THEN 'uncovered'
        ELSE 'unexplained'
    END AS cause,         -- NULL (not slow), or one of the causes above, 'uncovered' or 'unexplained'
    CASE WHEN slow THEN top_ns END AS cause_ns,  -- slow steps: size of the largest component, ns
    idle,                 -- idle step (batch 0 on a thread that reports batches, or marked idle)
    work,                 -- the user's work measure (spans.work), NULL if none
    baseline_model,       -- 'batch', 'stage', 'work_bucket' or 'work_fit' (step_baseline); NULL for idle steps
    lock_ns,              -- asleep until another thread of the process woke it, net of GC, ns; NULL outside sched coverage
    peer_ns,              -- waited for another process: asleep until a thread of another traced process woke it, or (slept or spun) inside the late peer span's excess (step_peer), net of GC, ns; NULL outside sched coverage without a peer span
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
    CASE WHEN cuda_cov THEN coalesce(c_cuda_copy_ns, 0) END AS cuda_copy_ns,       -- host time in CUDA memory copies, ns; NULL outside cuda coverage
    code_ns,              -- slow steps: the largest localized excess of the step's CPU profile (step_profile), capped by the on-CPU time left, ns; NULL for other steps and outside CPU-sampler coverage
    CASE WHEN code_ns > 0 THEN _cpu_node_label(code_frame_of.kind, cf1.function, cf1.file, cf1.line,
                                               cf2.function, cf2.file, cf2.line) END AS code_frame,  -- the deepest frame holding at least half of it: 'qualname (file:line)', or 'module:symbol <- qualname (file:line)' for native code
    CASE WHEN code_ns > 0 THEN code_frame_of.frame_id END AS code_frame_id,  -- its cpu_frames row (the line most sampled there)
    cpu_n AS cpu_samples,  -- user-mode CPU samples of the step with every Python frame walked (its profile); NULL outside CPU-sampler coverage
    cpu_kernel_n AS cpu_kernel_samples,  -- CPU samples taken in kernel mode (never code)
    cpu_slow_ns,          -- slow steps: the on-CPU time above the group's normal share when the cpu_slow test passed (else 0), capped by the on-CPU time left, ns; NULL for other steps and outside CPU-sampler coverage
    cpu_slow_evidence,    -- open slow steps: the evidence that the CPU gave less ('other_task', 'steal', 'band'); NULL: none
    cpu_slow_test,        -- open slow steps (no earlier component names them): 'cpu_slow', or why not: 'few_samples' (no test with cpu_slow_power), 'localized_excess' (a frame's share grew significantly: other work, not the same work slower), 'no_evidence'
    greatest(power_step, power_pop) AS cpu_slow_power,  -- open slow steps: the chance (0..1) the samples had of finding a localized excess of half the excess (the step's, or its group's open slow steps')
    CASE WHEN open THEN c_other_task_ns END AS other_task_ns,  -- open slow steps: run time of other processes on the thread's CPU right before its switch-ins in or just before the step, ns; NULL: none seen
    CASE WHEN open THEN c_other_task.pid END AS other_task_pid,    -- the one that ran longest: its tgid
    CASE WHEN open THEN c_other_task.comm END AS other_task_comm,  -- its comm
    band_share,           -- open slow steps in a slow band: share (0..1) of the other steps within 1 s that were longer than their baseline; NULL: no band
    band_steps,           -- the number of those steps
    gkey AS baseline_group,  -- the step's baseline group (see `groups`: its profile's baseline in step_profile)
    period_ns AS cpu_sample_period_ns,  -- the CPU sampler's period for the run (1e9 / cpu_sample_hz), ns
    late, peers, peer_late_ns, old_peer_ns, match_ns, blocked_raw_ns
FROM m
LEFT JOIN (SELECT frame_id AS f1_id, function, file, line FROM cpu_frames) cf1 ON cf1.f1_id = code_frame_of.frame_id
LEFT JOIN (SELECT frame_id AS f2_id, function, file, line FROM cpu_frames) cf2 ON cf2.f2_id = code_frame_of.py_frame_id
), hop AS (    -- from each step with a peer span to the peer whose own cause is not
               -- 'peer': at most 4 hops, a run never visited twice (cycles cut)
    SELECT run_id, tid, step_idx, late.run_id AS h_run_id, late.tid AS h_tid,
           late.step_idx AS h_step_idx, 1 AS depth, [run_id, late.run_id] AS seen
    FROM core WHERE late IS NOT NULL
    UNION ALL
    SELECT h.run_id, h.tid, h.step_idx, n.late.run_id, n.late.tid, n.late.step_idx, h.depth + 1,
           list_append(h.seen, n.late.run_id)
    FROM hop h
    JOIN core n ON n.run_id = h.h_run_id AND n.tid = h.h_tid AND n.step_idx = h.h_step_idx
    WHERE n.cause = 'peer' AND n.late IS NOT NULL AND h.depth < 4
      AND NOT list_contains(h.seen, n.late.run_id)
), hend AS (
    SELECT run_id, tid, step_idx, arg_max({'run_id': h_run_id, 'tid': h_tid, 'step_idx': h_step_idx}, depth) AS e,
           max(depth) AS depth
    FROM hop GROUP BY ALL
)
SELECT c.* EXCLUDE (late, peers, peer_late_ns, old_peer_ns, match_ns, blocked_raw_ns),
    CASE WHEN c.peer_ns > 0 THEN
        CASE WHEN c.match_ns > c.old_peer_ns AND coalesce(c.blocked_raw_ns, 0) * 2 < c.match_ns
             THEN 'spun' ELSE 'slept' END
    END AS peer_wait,     -- how the step waited for its peer: 'slept' (off CPU) or 'spun' (on CPU, polling); NULL when peer_ns is 0
    coalesce(h.e.run_id, CASE WHEN c.old_peer_ns > 0 THEN c.waker_run_id END) AS peer_run_id,  -- the peer's run: the late peer span's, followed while its own cause is 'peer' (peer_depth hops), else the traced waker's
    h.e.tid AS peer_tid,           -- that peer span's thread (a step of peer_run_id)
    h.e.step_idx AS peer_step_idx, -- its step_idx
    CASE WHEN e.cause <> 'peer' THEN e.cause END AS peer_cause,  -- that peer span's own cause (gc, preemption, lock, ...); NULL when it is not slow or the chain was cut (4 hops, a cycle)
    h.depth AS peer_depth,         -- hops from the step to that peer span (1: the late peer itself); NULL without a peer span
    c.peers,                       -- peer threads whose spans the step waited for (ranks); NULL without any
    c.peer_late_ns                 -- how much later the late peer finished than the next latest, ns; NULL with one peer
FROM core c
LEFT JOIN hend h USING (run_id, tid, step_idx)
LEFT JOIN core e ON e.run_id = h.e.run_id AND e.tid = h.e.tid AND e.step_idx = h.e.step_idx;
