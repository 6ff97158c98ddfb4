-- fixture: kernel
SELECT * FROM seed_gen2 ORDER BY ALL;
