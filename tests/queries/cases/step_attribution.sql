-- fixture: basic
SELECT * FROM step_attribution ORDER BY run_id, tid, step_idx;
