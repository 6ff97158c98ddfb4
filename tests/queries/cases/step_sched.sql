-- fixture: basic
SELECT * FROM step_sched ORDER BY run_id, tid, step_idx;
