-- fixture: hang
SELECT dump_id, run_id, pid, thread_pid, recovered_ns, tid, thread_name, state, wchan, syscall, source, depth, kind, function, file, line
FROM hang_dump_stacks ORDER BY tid, depth;
