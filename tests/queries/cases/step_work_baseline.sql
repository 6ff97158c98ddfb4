-- fixture: engines
SELECT * FROM step_work_baseline ORDER BY ALL;
