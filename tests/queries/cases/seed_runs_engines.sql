-- fixture: engines
SELECT * FROM seed_runs ORDER BY ALL;
