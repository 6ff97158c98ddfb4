"""The report's hang section: each dump the hang watchdog took (docs/hang.md)
with, per thread, where it was blocked.

A dump is one no-progress episode of a run (no step end for longer than its
threshold while it had work), with the threads of its process first, then
those of its run group's other processes. For each thread the section shows the
kernel's view (run state, wait channel or system call) and the *blocking
frame*: the innermost Python frame (the code that called into the wait, the
spin or the C call), with its caller and, when the CPU sampler saw the
thread on CPU, the native leaf under it. That is the line an operator opens
first; `stallscope query hang_dump_stacks` has every frame. The latest
MAX_DUMPS dumps are listed, newest first. Read-only: one scan of
`hang_dumps` and of the selected dumps' frames.
"""

from stallscope.analysis.formatting import format_table, query_rows

MAX_DUMPS = 10


def _where_frame(function, file, line):
    if function is None:
        return ""
    base = (file or "?").rsplit("/", 1)[-1]
    return f"{function} ({base}:{line})" if line is not None else f"{function} ({base})"


def _thread_rows(frames):
    """One row per thread from its frames (innermost first)."""
    out = []
    for (pid, tid, name, state, wchan, syscall, source), stack in frames.items():
        py = [f for f in stack if f[0] == "py" and f[1] is not None]
        native = next((f for f in stack if f[0] == "native" and f[1] is not None), None)
        waits = wchan or ("" if syscall is None else f"syscall {syscall}")
        out.append(
            (
                pid,
                tid,
                name,
                state,
                waits,
                source,
                _where_frame(*py[0][1:]) if py else "(no Python frame known)",
                _where_frame(*py[1][1:]) if len(py) > 1 else "",
                native[1] if native else "",
            )
        )
    return out


def hang_section(con, where):
    """Dumps of the selected runs, newest first, each with its threads'
    blocking frames; a database from before the watchdog says so."""
    try:
        _, dumps = query_rows(
            con,
            f"""
            SELECT d.dump_id, d.run_id, coalesce(r.label, ''), d.pid,
                   round((d.detected_ns - d.last_step_end_ns) / 1e9, 1),
                   CASE WHEN d.recovered_ns IS NULL THEN 'hung or left'
                        ELSE printf('recovered after %.1f s',
                                    (d.recovered_ns - d.last_step_end_ns) / 1e9) END,
                   d.threads, d.reason, d.lacks
            FROM hang_dumps d LEFT JOIN runs r USING (run_id)
            WHERE {where.replace("run_id", "d.run_id")}
            ORDER BY d.detected_ns DESC LIMIT {MAX_DUMPS}""",
        )
    except Exception as exc:  # a database from before the hang watchdog
        return f"== Hangs ==\n(none: {str(exc).splitlines()[0]})\n"
    text = "== Hangs (no step end while busy: the watchdog's dumps, newest first) ==\n"
    if not dumps:
        return text + "(none: no run stopped making progress)\n"
    ids = ", ".join(str(d[0]) for d in dumps)
    _, frames = query_rows(
        con,
        f"""
        SELECT dump_id, coalesce(thread_pid, pid), tid, thread_name, state, wchan, syscall,
               source, kind, function, file, line
        FROM hang_dump_stacks WHERE dump_id IN ({ids})
        ORDER BY dump_id, coalesce(thread_pid, pid) <> pid, coalesce(thread_pid, pid), tid, depth""",
    )
    by_dump = {}
    for (
        dump_id,
        pid,
        tid,
        name,
        state,
        wchan,
        syscall,
        source,
        kind,
        function,
        file,
        line,
    ) in frames:
        threads = by_dump.setdefault(dump_id, {})
        threads.setdefault((pid, tid, name, state, wchan, syscall, source), []).append(
            (kind, function, file, line)
        )
    for dump_id, run_id, label, pid, silent_s, outcome, nthreads, reason, lacks in dumps:
        text += (
            f"\ndump {dump_id}: run {run_id}{f' ({label})' if label else ''}, pid {pid}, "
            f"no step end for {silent_s} s when detected, {outcome}; {nthreads} threads\n"
            f"  {reason}\n"
        )
        if lacks:
            text += f"  lacks: {lacks}\n"
        rows = _thread_rows(by_dump.get(dump_id, {}))
        if rows:
            text += format_table(
                [
                    "pid",
                    "tid",
                    "thread",
                    "state",
                    "waits in",
                    "frames from",
                    "blocking frame",
                    "called from",
                    "native leaf",
                ],
                rows,
            )
    return text
