-- fixture: kernel
SELECT * FROM step_attribution ORDER BY ALL;
