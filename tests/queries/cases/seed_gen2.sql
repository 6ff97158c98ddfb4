-- fixture: basic
SELECT * FROM seed_gen2 ORDER BY run_id, gc_start_ns;
