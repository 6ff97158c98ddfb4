-- fixture: basic
SELECT * FROM gpu_run_clock ORDER BY run_id, gpu;
