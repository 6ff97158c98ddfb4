-- fixture: basic
SELECT * FROM seed_slow_steps ORDER BY run_id, stage, batch;
