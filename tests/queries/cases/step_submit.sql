-- fixture: basic
SELECT * FROM step_submit ORDER BY run_id, tid, step_idx;
