-- On-CPU time of the summarised threads of a step's process during the
-- step: which pool worker (a thread that never emits a span, summarised by
-- the bcc probe into sched_summary) ran while the step ran or waited. A
-- summary row holds a thread's on-CPU time over one read interval
-- (sched_summary_ms, 50 ms by default), so its share of a step is
-- estimated pro rata of the overlap: read it at the interval's resolution,
-- never as an exact interval. Empty without summarised threads.

-- One row per step and summarised sibling that was on CPU during it.
CREATE OR REPLACE VIEW step_sibling_cpu AS
SELECT
    s.run_id,             -- run
    s.tid,                -- step's thread
    s.step_idx,           -- step index on the thread
    m.tid AS sibling_tid, -- summarised thread of the same process
    round(sum(m.oncpu_ns * (least(m.end_ns, s.end_ns) - greatest(m.start_ns, s.start_ns))
              / (m.end_ns - m.start_ns)))::BIGINT AS oncpu_ns,  -- its on-CPU time in the step (pro rata), ns
    max(m.end_ns - m.start_ns) AS resolution_ns  -- longest summary interval used, ns
FROM _step s
JOIN sched_summary m
  ON m.pid = s.pid AND m.tid <> s.tid AND m.end_ns > m.start_ns
 AND m.start_ns < s.end_ns AND s.start_ns < m.end_ns
WHERE m.oncpu_ns > 0
GROUP BY s.run_id, s.tid, s.step_idx, m.tid;
