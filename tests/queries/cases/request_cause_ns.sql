-- fixture: requests
SELECT * FROM request_cause_ns ORDER BY run_id, request_id, cause;
