-- fixture: basic
SELECT * FROM step_baseline ORDER BY run_id, stage, batch;
