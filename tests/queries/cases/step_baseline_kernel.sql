-- fixture: kernel
SELECT * FROM step_baseline ORDER BY ALL;
