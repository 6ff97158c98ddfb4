-- fixture: cpu
SELECT p.tid, p.step_idx, p.level, p.node_kind, p.frame, p.frame_id, p.samples, p.expected_samples,
       p.excess_ns, p.share, p.localized_ns, p.significant, p.samples_in_submit
FROM step_profile p JOIN _step s USING (run_id, tid, step_idx)
WHERE s.start_ns IN (1000000000, 2000000000, 2020000000, 2040000000, 3000000000)
ORDER BY p.tid, p.step_idx, p.level, p.frame;
