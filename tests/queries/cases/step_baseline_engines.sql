-- fixture: engines
SELECT * FROM step_baseline ORDER BY ALL;
