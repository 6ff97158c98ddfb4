-- fixture: cpu
SELECT tid, step_idx, stage, (start_ns // 1000000) AS start_ms, excess_ns, cause, cause_ns,
       code_ns, code_frame, code_frame_id, submit_host_ns, cpu_slow_ns, cpu_slow_evidence, cpu_slow_test,
       round(cpu_slow_power, 4) AS cpu_slow_power, other_task_ns, other_task_pid, other_task_comm,
       steal_ns, band_share, band_steps, cpu_samples, cpu_kernel_samples, baseline_group
FROM step_attribution WHERE slow ORDER BY tid, step_idx;
