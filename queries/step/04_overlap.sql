-- Everything that takes time inside a step, joined to the steps once.
-- Sources: GC passes (a pass on any thread of the run stops the step's
-- thread, which needs the GIL, so a pass is joined to every step thread of
-- its run), and the step thread's own kernel rows: off-CPU intervals,
-- run-queue waits, migrations, system calls, page faults and IRQ time
-- (keyed by (pid, tid), mapped to the run by runs.pid). Time charged =
-- length of the intersection with the step.

-- Off-CPU intervals with who ended them and the wait's class, one row per
-- exact offcpu row. cls: 'yield' (switched out inside sched_yield(): the
-- thread gave its CPU away itself, so what ran instead is no preemptor; its
-- time is run-queue wait), 'preemption' (involuntary switch-out), 'throttled'
-- (involuntary, and the CPU then ran the idle task: nothing else wanted it,
-- so the thread was held off by a CPU quota), 'lock' (woken by another
-- thread of the same process), 'peer' (woken by a thread of another traced
-- process), 'blocked' (anything else: a timer, an interrupt, an untraced
-- process, or unknown). A wait that ended by a timer or interrupt, or with
-- no known waker, takes the waker of the wait that follows it when the
-- thread went off CPU again within step_params.lock_chain_gap_ns and that
-- chain (through more such waits, and preemptions) ends with a thread's
-- wake-up: a GIL waiter times out every switch interval and waits again
-- until the holder wakes it. A chain whose end names no thread takes the
-- thread wake-up that began it (the sibling that woke the step and then
-- kept the GIL).
-- Scoped (see _step_todo_bound): only the rows from offcpu_from_ns on, which
-- hold every lock chain of the rows that overlap unfilled steps.
CREATE OR REPLACE MACRO _offcpu_event_of(scoped) AS TABLE
WITH p AS (SELECT * FROM step_params),
src AS (
    SELECT * FROM offcpu
    WHERE NOT scoped OR (start_ns >= (SELECT offcpu_from_ns FROM _step_todo_bound)
                         AND start_ns <= coalesce(getvariable('_step_fill_until_ns'), 9223372036854775807))
), vol AS (    -- off-CPU rows of a probe that reports wake-ups and preemptors (none
            -- in older data): a chain runs through timed-out waits, waits
            -- with an unknown waker and preemptions, to a thread's wake-up
    SELECT pid, tid, start_ns, end_ns, waker_pid, waker_tid, waker_comm, preempted,
           lead(start_ns) OVER (PARTITION BY pid, tid ORDER BY start_ns) - end_ns AS gap_after,
           start_ns - lag(end_ns) OVER (PARTITION BY pid, tid ORDER BY start_ns) AS gap_before
    FROM src
    WHERE end_ns > start_ns AND resolution_ns IS NULL
      AND (wakeup_ns IS NOT NULL OR waker_tid IS NOT NULL OR waker_irq OR preemptor_pid IS NOT NULL)
), chain AS (
    SELECT v.pid, v.tid, v.start_ns, v.waker_tid IS NOT NULL OR coalesce(v.preempted, false) AS own,
        first_value(CASE WHEN v.waker_tid IS NOT NULL AND NOT coalesce(v.preempted, false) THEN
            {'s': v.start_ns, 'pid': v.waker_pid, 'tid': v.waker_tid, 'comm': v.waker_comm} END IGNORE NULLS)
            OVER f AS nxt,
        first_value(CASE WHEN v.gap_after IS NULL OR v.gap_after > p.lock_chain_gap_ns THEN v.end_ns END
            IGNORE NULLS) OVER f AS chain_end_ns,
        last_value(CASE WHEN v.waker_tid IS NOT NULL AND NOT coalesce(v.preempted, false) THEN
            {'s': v.start_ns, 'pid': v.waker_pid, 'tid': v.waker_tid, 'comm': v.waker_comm} END IGNORE NULLS)
            OVER b AS prv,
        last_value(CASE WHEN v.gap_before IS NULL OR v.gap_before > p.lock_chain_gap_ns THEN v.start_ns END
            IGNORE NULLS) OVER b AS chain_begin_ns
    FROM vol v, p
    WINDOW f AS (PARTITION BY v.pid, v.tid ORDER BY v.start_ns ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING),
           b AS (PARTITION BY v.pid, v.tid ORDER BY v.start_ns ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
), eff AS (  -- the waker a timed-out wait inherits from its chain: the thread
             -- wake-up that ends it, else the one that began it
    SELECT pid, tid, start_ns,
        CASE WHEN nxt.s < chain_end_ns THEN nxt ELSE prv END AS w
    FROM chain
    WHERE NOT own AND (nxt.s < chain_end_ns OR prv.s >= chain_begin_ns)
), eff1 AS (
    SELECT pid, tid, start_ns, w.pid AS waker_pid, w.tid AS waker_tid, w.comm AS waker_comm FROM eff
), traced AS (SELECT pid, max(run_id) AS run_id FROM runs WHERE pid IS NOT NULL GROUP BY pid)
SELECT o.pid, o.tid, o.start_ns, o.end_ns, o.preempted,
    o.wakeup_ns,
    CASE WHEN o.preempted THEN o.preemptor_pid ELSE coalesce(o.waker_pid, e.waker_pid) END AS who_pid,
    CASE WHEN o.preempted THEN o.preemptor_tid ELSE coalesce(o.waker_tid, e.waker_tid) END AS who_tid,
    CASE WHEN o.preempted THEN o.preemptor_comm ELSE coalesce(o.waker_comm, e.waker_comm) END AS who_comm,
    t.run_id AS who_run_id,
    CASE
        WHEN o.preempted AND coalesce(o.yielded, false) THEN 'yield'
        WHEN o.preempted AND o.preemptor_pid = 0 THEN 'throttled'
        WHEN o.preempted THEN 'preemption'
        WHEN coalesce(o.waker_pid, e.waker_pid) = o.pid
             AND coalesce(o.waker_tid, e.waker_tid) <> o.tid THEN 'lock'
        WHEN t.run_id IS NOT NULL AND coalesce(o.waker_pid, e.waker_pid) <> o.pid THEN 'peer'
        ELSE 'blocked'
    END AS cls
FROM src o
LEFT JOIN eff1 e ON e.pid = o.pid AND e.tid = o.tid AND e.start_ns = o.start_ns
LEFT JOIN traced t
  ON t.pid = CASE WHEN o.preempted THEN o.preemptor_pid ELSE coalesce(o.waker_pid, e.waker_pid) END
WHERE o.end_ns > o.start_ns AND o.resolution_ns IS NULL;

CREATE OR REPLACE VIEW _offcpu_event AS SELECT * FROM _offcpu_event_of(false);

-- Kernel rows with resolution_ns set are the /proc backend's per-window
-- totals, not intervals: they cannot be placed in a step and are left out.
-- (Rows of other threads are not filtered out first with a semi join: that
-- made DuckDB underestimate this side and build its hash table on it,
-- several times slower.)
-- Source rows of step threads. src: 0 GC pass, 1 off-CPU, 2 run-queue
-- wait, 3 migration (an instant: xs = xe), 4 system calls, 5 page faults
-- (xs = xe allowed: an instant), 6 IRQ time, 7 CUDA driver calls (label:
-- the kind, n: count, v_ns: total_ns). Kernel rows keep their pid;
-- GC rows are repeated for every step thread of their run. Columns that
-- only some sources fill: generation (GC), preempted, wake_ns, who_*, cls
-- (off-CPU), n (GC: objects collected; syscalls, page faults: count),
-- v_ns (syscalls: total_ns; page faults: cost_ns), label (off-CPU: who's
-- comm; syscalls: the name).
-- Scoped: only rows that end at or after _step_todo_bound.first_ns (the
-- others overlap no unfilled step).
CREATE OR REPLACE MACRO _step_interval_of(scoped) AS TABLE
WITH bound AS (SELECT * FROM _step_todo_bound WHERE scoped),
threads AS (
    SELECT * FROM _step_thread WHERE NOT scoped
    UNION ALL SELECT DISTINCT run_id, pid, tid FROM _step_todo WHERE scoped
)
SELECT t.pid, t.tid, 0::UTINYINT AS src, g.generation, NULL::BOOLEAN AS preempted,
       g.collected AS n, NULL::BIGINT AS v_ns, g.start_ns AS xs, g.end_ns AS xe,
       NULL::BIGINT AS wake_ns, NULL::INTEGER AS who_pid, NULL::INTEGER AS who_tid,
       NULL::BIGINT AS who_run_id, NULL::VARCHAR AS label, NULL::VARCHAR AS cls
FROM gc_events g JOIN threads t USING (run_id)
WHERE g.end_ns > g.start_ns AND (NOT scoped OR g.end_ns >= (SELECT first_ns FROM bound))
UNION ALL
SELECT pid, tid, 1::UTINYINT, NULL, preempted, NULL, NULL, start_ns, end_ns,
       wakeup_ns, who_pid, who_tid, who_run_id, who_comm, cls
FROM _offcpu_event_of(scoped)
WHERE NOT scoped OR end_ns >= (SELECT first_ns FROM bound)
UNION ALL
SELECT pid, tid, 2::UTINYINT, NULL, NULL, NULL, NULL, start_ns, end_ns, NULL, NULL, NULL, NULL, NULL, NULL
FROM runq WHERE end_ns > start_ns AND resolution_ns IS NULL
  AND (NOT scoped OR end_ns >= (SELECT first_ns FROM bound))
UNION ALL
SELECT pid, tid, 3::UTINYINT, NULL, NULL, NULL, NULL, ts_ns, ts_ns, NULL, NULL, NULL, NULL, NULL, NULL
FROM migrations WHERE from_cpu IS DISTINCT FROM to_cpu AND resolution_ns IS NULL
  AND (NOT scoped OR ts_ns >= (SELECT first_ns FROM bound))
UNION ALL
SELECT pid, tid, 4::UTINYINT, NULL, NULL, coalesce(count, 1), coalesce(total_ns, end_ns - start_ns),
       start_ns, end_ns, NULL, NULL, NULL, NULL, name, NULL
FROM syscalls WHERE end_ns >= start_ns AND (NOT scoped OR end_ns >= (SELECT first_ns FROM bound))
UNION ALL
SELECT pid, tid, 5::UTINYINT, NULL, NULL, count, cost_ns, start_ns, end_ns,
       NULL, NULL, NULL, NULL, NULL, NULL
FROM page_faults WHERE end_ns >= start_ns AND (NOT scoped OR end_ns >= (SELECT first_ns FROM bound))
UNION ALL
SELECT pid, tid, 6::UTINYINT, NULL, NULL, NULL, NULL, start_ns, end_ns,
       NULL, NULL, NULL, NULL, kind, NULL
FROM irq_time WHERE end_ns > start_ns AND (NOT scoped OR end_ns >= (SELECT first_ns FROM bound))
UNION ALL
SELECT pid, tid, 7::UTINYINT, NULL, NULL, coalesce(count, 1), coalesce(total_ns, end_ns - start_ns),
       start_ns, end_ns, NULL, NULL, NULL, NULL, kind, NULL
FROM cuda_calls WHERE end_ns >= start_ns AND (NOT scoped OR end_ns >= (SELECT first_ns FROM bound));

CREATE OR REPLACE VIEW _step_interval AS SELECT * FROM _step_interval_of(false);

-- Every (source row, step) pair that overlaps (for instants: the step that
-- contains the instant), with the intersection [a_ns, b_ns], for the
-- sources src_lo..src_hi: a table macro, so that a reader of one source
-- (the GC passes, the syscalls) does not map every source's rows. Scoped:
-- the pairs of the unfilled steps (_step_todo) only.
CREATE OR REPLACE MACRO _step_overlap_of(src_lo, src_hi, scoped) AS TABLE
WITH steps AS (
    SELECT run_id, pid, tid, start_ns, end_ns, step_idx FROM _step WHERE NOT scoped
    UNION ALL SELECT run_id, pid, tid, start_ns, end_ns, step_idx FROM _step_todo WHERE scoped
), threads AS (   -- each thread's first step (0 unless scoped)
    SELECT run_id, pid, tid, min(step_idx) AS first_idx FROM steps GROUP BY ALL
), bucket AS (
    SELECT * FROM _step_bucket WHERE NOT scoped UNION ALL SELECT * FROM _step_todo_bucket WHERE scoped
), cover AS (
    SELECT * FROM _step_cover WHERE NOT scoped UNION ALL SELECT * FROM _step_todo_cover WHERE scoped
), hit AS (   -- the step whose span contains each row's start (bucket equi-join)
    SELECT i.*, c.run_id, c.step_idx, c.start_ns, c.end_ns
    FROM (SELECT * FROM _step_interval_of(scoped) WHERE src BETWEEN src_lo AND src_hi
          AND (NOT scoped OR xs <= coalesce(getvariable('_step_fill_until_ns'), 9223372036854775807))) i
    CROSS JOIN bucket b
    LEFT JOIN cover c
      ON c.pid = i.pid AND c.tid = i.tid AND c.bucket = i.xs // b.bucket_ns
     AND i.xs >= c.start_ns AND i.xs < c.end_ns
), rest AS (    -- starts outside every step, or reaches past its step's end
    SELECT h.* EXCLUDE (run_id, step_idx, start_ns, end_ns, pid), t.run_id, t.first_idx
    FROM hit h JOIN threads t ON t.pid = h.pid AND t.tid = h.tid
    WHERE h.xe > h.xs AND (h.step_idx IS NULL OR h.xe > h.end_ns)
), ra AS (
    SELECT r.* EXCLUDE (first_idx), coalesce(s.step_idx, r.first_idx) AS ka
    FROM rest r ASOF LEFT JOIN steps s ON r.run_id = s.run_id AND r.tid = s.tid AND r.xs >= s.start_ns
), rb AS (
    SELECT ra.*, s.step_idx AS kb
    FROM ra ASOF JOIN steps s ON ra.run_id = s.run_id AND ra.tid = s.tid AND ra.xe > s.start_ns
), rp AS (
    SELECT rb.* EXCLUDE (ka, kb), unnest(range(ka, kb + 1)) AS step_idx
    FROM rb WHERE kb >= ka
), pairs AS (
    SELECT * EXCLUDE (pid) FROM hit
    WHERE step_idx IS NOT NULL AND (xs = xe OR xe <= end_ns)
    UNION ALL BY NAME
    SELECT rp.*, s.start_ns, s.end_ns
    FROM rp JOIN steps s USING (run_id, tid, step_idx)
    WHERE rp.xs < s.end_ns AND s.start_ns < rp.xe
)
SELECT run_id, tid, step_idx, src, generation, preempted, n, v_ns, xs, xe,
       wake_ns, who_pid, who_tid, who_run_id, label, cls,
       greatest(xs, start_ns) AS a_ns,                           -- intersection start, ns
       least(xe, end_ns) AS b_ns,                                -- intersection end, ns
       least(xe, end_ns) - greatest(xs, start_ns) AS overlap_ns  -- ns (0 for instants)
FROM pairs;

-- Every source's pairs.
CREATE OR REPLACE VIEW _step_overlap AS SELECT * FROM _step_overlap_of(0, 255, false);

-- Per step, every time component in one pass (step_attribution reads this).
-- Off-CPU time is split so that its parts are disjoint: an off-CPU
-- interval's intersection with the step is, for an involuntary switch-out,
-- preempted (or throttled) time; for a voluntary one, the sleep until the
-- wake-up (wake_ns; lock, peer or blocked by who woke it) and then the
-- run-queue wait after it. Any of that which a GC pass of the run overlaps
-- is taken out: it is GC time. GC passes of one process never overlap (a
-- collection stops every thread, with or without the GIL), so GC time is
-- their sum. Raw (unsplit) totals are kept for step_sched.
-- The *_in_submit_ns columns need the submit bounds: joined here, per pair.
-- Scoped: of the unfilled steps only (what the filler stores, and what the
-- view below adds to the stored rows).
CREATE OR REPLACE MACRO _step_components_of(scoped) AS TABLE
WITH o AS MATERIALIZED (
    SELECT * FROM _step_overlap_of(0, 255, scoped)
), gcl AS (     -- the GC passes inside each step, as a list of [a, b]
    SELECT run_id, tid, step_idx, list({'a': a_ns, 'b': b_ns}) AS gcs
    FROM o WHERE src = 0 GROUP BY run_id, tid, step_idx
), syl AS (    -- the exact CUDA syncs and polling loops inside each step, as a list of [a, b]
    SELECT run_id, tid, step_idx, list({'a': a_ns, 'b': b_ns}) AS syncs
    FROM o WHERE src = 7 AND n = 1 AND label IN ('sync', 'poll') GROUP BY run_id, tid, step_idx
), x AS (
    SELECT o.*,
        CASE WHEN f.submit_start_ns IS NULL THEN 0   -- least/greatest skip NULLs: guard
             ELSE greatest(0, least(o.xe, f.submit_end_ns) - greatest(o.xs, f.submit_start_ns)) END
            AS in_submit_ns,
        -- end of the sleep part (voluntary off-CPU): the wake-up, else the end
        CASE WHEN o.src = 1 AND NOT coalesce(o.preempted, false) THEN
            CASE WHEN o.wake_ns IS NULL THEN o.b_ns ELSE least(o.b_ns, greatest(o.a_ns, o.wake_ns)) END
        END AS m_ns,
        g.gcs, sy.syncs, tp.cuda_sync_tail_ns AS sync_tail_ns
    FROM o
    CROSS JOIN (SELECT cuda_sync_tail_ns FROM step_params) tp
    LEFT JOIN _step_submit_call_of(scoped) f USING (run_id, tid, step_idx)
    LEFT JOIN gcl g ON o.src IN (1, 6) AND g.run_id = o.run_id AND g.tid = o.tid AND g.step_idx = o.step_idx
    LEFT JOIN syl sy ON o.src = 1 AND sy.run_id = o.run_id AND sy.tid = o.tid AND sy.step_idx = o.step_idx
), y AS (
    SELECT x.*,
        -- off-CPU time inside the step's exact CUDA syncs while the GPU was
        -- still busy: asleep until the wake-up (the driver's: the GPU was
        -- done), or preempted when the sync went on after it (the thread
        -- waited on). Held: the run-queue wait after a wake-up, and a
        -- preemption the sync ended right after (cuda_sync_tail_ns): the GPU
        -- may have been done meanwhile, so that time is the CPU's.
        CASE WHEN syncs IS NULL THEN 0
             WHEN m_ns IS NOT NULL THEN
                 list_sum([greatest(0, least(m_ns, q.b) - greatest(a_ns, q.a)) FOR q IN syncs])
             ELSE list_sum([CASE WHEN q.b - b_ns > sync_tail_ns
                                 THEN greatest(0, least(b_ns, q.b) - greatest(a_ns, q.a)) ELSE 0 END
                            FOR q IN syncs]) END AS in_sync_off_ns,
        CASE WHEN syncs IS NULL THEN 0
             WHEN m_ns IS NOT NULL THEN
                 list_sum([greatest(0, least(b_ns, q.b) - greatest(m_ns, q.a)) FOR q IN syncs])
             ELSE list_sum([CASE WHEN q.b - b_ns <= sync_tail_ns
                                 THEN greatest(0, least(b_ns, q.b) - greatest(a_ns, q.a)) ELSE 0 END
                            FOR q IN syncs]) END AS in_sync_held_ns,
        -- GC time inside [a, m] (the sleep or preempted part) and [m, b] (the run-queue part)
        CASE WHEN gcs IS NULL THEN 0 ELSE
            list_sum([greatest(0, least(coalesce(m_ns, b_ns), q.b) - greatest(a_ns, q.a)) FOR q IN gcs]) END
            AS gc_first_ns,
        CASE WHEN gcs IS NULL OR m_ns IS NULL THEN 0 ELSE
            list_sum([greatest(0, least(b_ns, q.b) - greatest(m_ns, q.a)) FOR q IN gcs]) END
            AS gc_rq_ns
    FROM x
), z AS (
    SELECT y.*,
        -- (clamped at 0: should passes of one run ever overlap, as they never do
        -- from a real process, their sum could exceed the part)
        CASE WHEN src = 1 AND preempted THEN greatest(0, overlap_ns - gc_first_ns) END AS pre_net_ns,
        CASE WHEN src = 1 AND m_ns IS NOT NULL THEN greatest(0, m_ns - a_ns - gc_first_ns) END AS sleep_net_ns,
        CASE WHEN src = 1 AND m_ns IS NOT NULL THEN greatest(0, b_ns - m_ns - gc_rq_ns) END AS rq_net_ns,
        -- pro-rated share of a summary row (syscalls, page faults) inside the step (0..1)
        CASE WHEN xe > xs THEN overlap_ns / (xe - xs) ELSE 1.0 END AS frac
    FROM y
), sc AS (      -- system-call time per step and syscall name
    SELECT run_id, tid, step_idx, label AS name,
           sum(CASE WHEN n <= 1 OR xe <= xs THEN overlap_ns ELSE v_ns * overlap_ns / (xe - xs) END) AS ns
    FROM _step_overlap_of(4, 4, scoped) GROUP BY ALL
), scs AS (
    SELECT run_id, tid, step_idx, sum(ns)::BIGINT AS syscall_total_ns, arg_max(name, (ns, name)) AS top_syscall
    FROM sc GROUP BY ALL
), who_time AS ( -- time per preemptor and per waker in each step (from the pairs that
                  -- name one: none without the waker columns)
    SELECT run_id, tid, step_idx, coalesce(preempted, false) AS preempted,
           {'pid': who_pid, 'tid': CASE WHEN NOT coalesce(preempted, false) THEN who_tid END,
            'comm': label, 'run_id': who_run_id} AS who,
           sum(CASE WHEN preempted THEN overlap_ns
                    ELSE (CASE WHEN wake_ns IS NULL THEN b_ns ELSE least(b_ns, greatest(a_ns, wake_ns)) END) - a_ns
               END) AS ns
    FROM o WHERE src = 1 AND cls IS DISTINCT FROM 'yield'  -- a yield names no preemptor
          AND (who_pid IS NOT NULL OR who_tid IS NOT NULL OR label IS NOT NULL)
    GROUP BY ALL
), who AS (     -- the task that held the CPU for most of the preempted time, the thread
                -- the step waited on for most of its sleep
    SELECT run_id, tid, step_idx,
        arg_max(who, (ns, who.comm)) FILTER (preempted) AS preemptor,
        arg_max(who, (ns, who.comm)) FILTER (NOT preempted) AS waker
    FROM who_time GROUP BY run_id, tid, step_idx
), agg AS (
    SELECT
        run_id, tid, step_idx,
        coalesce(sum(overlap_ns) FILTER (src = 0), 0)::BIGINT AS gc_ns,
        coalesce(sum(overlap_ns) FILTER (src = 0 AND generation = 0), 0)::BIGINT AS gc0_ns,
        coalesce(sum(overlap_ns) FILTER (src = 0 AND generation = 1), 0)::BIGINT AS gc1_ns,
        coalesce(sum(overlap_ns) FILTER (src = 0 AND generation = 2), 0)::BIGINT AS gc2_ns,
        count(*) FILTER (src = 0) AS gc_passes,
        arg_max(generation, (overlap_ns, generation)) FILTER (src = 0) AS gc_generation,
        sum(n) FILTER (src = 0)::BIGINT AS gc_collected,
        coalesce(sum(in_submit_ns) FILTER (src = 0), 0)::BIGINT AS gc_in_submit_ns,
        -- raw kernel time (not split, not net of GC)
        coalesce(sum(overlap_ns) FILTER (src = 1 AND preempted), 0)::BIGINT AS preempted_raw_ns,
        coalesce(sum(overlap_ns) FILTER (src = 1 AND NOT coalesce(preempted, false)), 0)::BIGINT AS blocked_raw_ns,
        coalesce(sum(overlap_ns) FILTER (src = 2), 0)::BIGINT AS runq_raw_ns,
        count(*) FILTER (src = 3) AS migrations,
        count(*) FILTER (src = 1) AS offcpu_intervals,
        coalesce(sum(in_submit_ns) FILTER (src = 1), 0)::BIGINT AS offcpu_in_submit_ns,
        -- disjoint off-CPU parts, net of GC
        coalesce(sum(pre_net_ns) FILTER (cls = 'preemption'), 0)::BIGINT AS preemption_ns,
        coalesce(sum(pre_net_ns) FILTER (cls = 'throttled'), 0)::BIGINT AS throttled_ns,
        coalesce(sum(sleep_net_ns) FILTER (cls = 'lock'), 0)::BIGINT AS lock_ns,
        coalesce(sum(sleep_net_ns) FILTER (cls = 'peer'), 0)::BIGINT AS peer_ns,
        coalesce(sum(sleep_net_ns) FILTER (cls = 'blocked' AND wake_ns IS NOT NULL), 0)::BIGINT AS blocked_woken_ns,
        coalesce(sum(sleep_net_ns) FILTER (cls = 'blocked' AND wake_ns IS NULL), 0)::BIGINT AS blocked_unsplit_ns,
        -- waiting for a CPU: after a wake-up, or after a sched_yield()
        (coalesce(sum(rq_net_ns), 0) + coalesce(sum(pre_net_ns) FILTER (cls = 'yield'), 0))::BIGINT
            AS runqueue_woken_ns,
        -- page faults (summary rows pro-rated by their overlap), IRQ time net of GC
        round(sum(n * frac) FILTER (src = 5))::BIGINT AS page_faults,
        round(sum(v_ns * frac) FILTER (src = 5))::BIGINT AS page_fault_raw_ns,
        sum(greatest(0, overlap_ns - gc_first_ns)) FILTER (src = 6)::BIGINT AS irq_raw_ns,
        -- CUDA driver time (summary rows pro-rated by their overlap)
        round(sum(CASE WHEN n <= 1 OR xe <= xs THEN overlap_ns ELSE v_ns * frac END)
              FILTER (src = 7 AND label = 'launch'))::BIGINT AS cuda_launch_ns,
        round(sum(n * frac) FILTER (src = 7 AND label = 'launch'))::BIGINT AS cuda_launches,
        round(sum(CASE WHEN n <= 1 OR xe <= xs THEN overlap_ns ELSE v_ns * frac END)
              FILTER (src = 7 AND label IN ('sync', 'poll')))::BIGINT AS cuda_sync_ns,
        sum(in_sync_off_ns) FILTER (src = 1)::BIGINT AS cuda_sync_off_ns,
        sum(in_sync_held_ns) FILTER (src = 1)::BIGINT AS cuda_sync_held_ns,
        round(sum(CASE WHEN n <= 1 OR xe <= xs THEN overlap_ns ELSE v_ns * frac END)
              FILTER (src = 7 AND label = 'copy'))::BIGINT AS cuda_copy_ns,
        -- processes named by the step's off-CPU rows (the filler's invalidation key)
        list_sort(list(DISTINCT who_pid) FILTER (src = 1 AND who_pid IS NOT NULL)) AS who_pids
    FROM z
    GROUP BY run_id, tid, step_idx
)
SELECT agg.*, who.preemptor, who.waker, scs.syscall_total_ns, scs.top_syscall
FROM agg
LEFT JOIN who USING (run_id, tid, step_idx)
LEFT JOIN scs USING (run_id, tid, step_idx);

-- Per step, every time component: the filled steps from step_components,
-- the others computed now.
CREATE OR REPLACE VIEW _step_components AS
SELECT m.run_id, m.tid, m.step_idx, m.gc_ns, m.gc0_ns, m.gc1_ns, m.gc2_ns, m.gc_passes,
    m.gc_generation, m.gc_collected, m.gc_in_submit_ns, m.preempted_raw_ns, m.blocked_raw_ns,
    m.runq_raw_ns, m.migrations, m.offcpu_intervals, m.offcpu_in_submit_ns, m.preemption_ns,
    m.throttled_ns, m.lock_ns, m.peer_ns, m.blocked_woken_ns, m.blocked_unsplit_ns,
    m.runqueue_woken_ns, m.page_faults, m.page_fault_raw_ns, m.irq_raw_ns, m.cuda_launch_ns,
    m.cuda_launches, m.cuda_sync_ns, m.cuda_sync_off_ns, m.cuda_sync_held_ns, m.cuda_copy_ns,
    m.who_pids,
    m.preemptor, m.waker, m.syscall_total_ns, m.top_syscall
FROM step_components m JOIN _step_frontier f USING (run_id, tid)
WHERE m.step_idx <= f.filled_idx AND m.has_components
UNION ALL BY NAME
SELECT * FROM _step_components_of(true);
