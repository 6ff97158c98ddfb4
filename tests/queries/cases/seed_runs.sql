-- fixture: basic
SELECT * FROM seed_runs ORDER BY run_id;
