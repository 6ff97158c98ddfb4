-- fixture: peer
SELECT run_id, step_idx, duration_ns, excess_ns, slow, cause, cause_ns, gc_ns, preempted_ns, peer_ns,
       peer_wait, peer_run_id, peer_tid, peer_step_idx, peer_cause, peer_depth, peers, peer_late_ns
FROM step_attribution WHERE run_id <> 9 OR step_idx < 2 ORDER BY run_id, step_idx;
