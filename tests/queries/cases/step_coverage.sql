-- fixture: kernel
SELECT * FROM step_coverage ORDER BY ALL;
