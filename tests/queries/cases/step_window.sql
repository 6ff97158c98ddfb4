-- fixture: basic
SELECT * FROM step_window ORDER BY run_id;
