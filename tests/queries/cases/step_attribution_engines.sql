-- fixture: engines
SELECT * FROM step_attribution ORDER BY ALL;
