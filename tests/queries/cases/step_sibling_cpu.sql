-- fixture: kernel
SELECT * FROM step_sibling_cpu ORDER BY run_id, tid, step_idx, sibling_tid;
