-- fixture: engines
SELECT * FROM seed_slow_steps ORDER BY ALL;
