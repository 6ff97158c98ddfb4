-- fixture: cpu
SELECT run_id, baseline_group, slow_steps, normal_steps, level, frame, slow_samples, normal_samples,
       slow_share, normal_share, excess_ns, z, parent IS NULL AS root
FROM step_profile_diff
ORDER BY run_id, baseline_group, level, frame;
