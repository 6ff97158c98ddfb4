-- fixture: kernel
SELECT * FROM seed_runs ORDER BY ALL;
