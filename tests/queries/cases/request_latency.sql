-- fixture: requests
SELECT * FROM request_latency ORDER BY run_id, request_id;
