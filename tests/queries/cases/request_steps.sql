-- fixture: requests
SELECT * FROM request_steps ORDER BY run_id, ts_ns, request_id;
