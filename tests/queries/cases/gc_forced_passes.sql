-- fixture: gc
SELECT * FROM gc_forced_passes ORDER BY ALL;
