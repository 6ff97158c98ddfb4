-- fixture: basic
SELECT * FROM step_gc ORDER BY run_id, tid, step_idx;
