-- fixture: requests
SELECT * FROM request_run_latency ORDER BY run_id;
