-- fixture: basic
SELECT * FROM step_gpu ORDER BY run_id, tid, step_idx;
