"""The report's run-group section: each engine of more than one process
(runs sharing a `group_key`: a vLLM API process, its engine core, its
workers), each process's role, and the cross-process causes of their slow
steps, where a step waited for another process of the group (`peer`) and
that peer's own step had a cause of its own. Read-only: two grouped scans
of `runs`, `run_events` and `step_attribution`.
"""

from stallscope.analysis.formatting import format_table
from stallscope.analysis.formatting import query_rows as _rows

HEADING = "== Run groups (processes of one engine) ==\n"
NO_GROUPS = "(none: every run is a process of its own)\n"


def group_section(con, where):
    """Run groups of more than one process: each process and its role, and
    the cross-process causes of its slow steps (a peer span's own cause)."""
    try:
        # The grouped scans below cost ~0.5 s of planning on any database;
        # most engines are one process, so ask the runs table first.
        if not con.execute(
            f"""SELECT 1 FROM runs WHERE group_key IS NOT NULL AND {where}
                GROUP BY group_key HAVING count(*) > 1 LIMIT 1"""
        ).fetchone():
            return HEADING + NO_GROUPS
        _, procs = _rows(
            con,
            f"""
            WITH g AS (
                SELECT group_key FROM runs WHERE group_key IS NOT NULL AND {where}
                GROUP BY group_key HAVING count(*) > 1
            ), role AS (
                SELECT run_id, string_agg(DISTINCT message, ', ' ORDER BY message) AS role
                FROM run_events WHERE kind = 'role' GROUP BY run_id
            ), st AS (
                SELECT run_id, count(*) AS steps, count(*) FILTER (slow) AS slow,
                       count(*) FILTER (cause = 'peer') AS peer
                FROM step_attribution GROUP BY run_id
            )
            SELECT r.group_key, r.run_id, r.label, r.pid, r.parent_run_id,
                   coalesce(CASE WHEN r.rank IS NOT NULL THEN 'rank ' || r.rank END, role.role, 'process'),
                   coalesce(st.steps, 0), coalesce(st.slow, 0), coalesce(st.peer, 0)
            FROM runs r JOIN g USING (group_key)
            LEFT JOIN role USING (run_id) LEFT JOIN st USING (run_id)
            WHERE {where.replace("run_id", "r.run_id")}
            ORDER BY r.group_key, r.run_id""",
        )
        _, causes = _rows(
            con,
            f"""
            SELECT a.run_id, a.peer_run_id, coalesce(a.peer_cause, '(not named)'),
                   count(*), round(sum(a.peer_ns) / 1e6, 3), max(a.peer_depth),
                   round(max(a.peer_late_ns) / 1e6, 3),
                   string_agg(DISTINCT a.peer_wait, '/' ORDER BY a.peer_wait)
            FROM step_attribution a
            WHERE a.slow AND a.cause = 'peer' AND a.peer_run_id IS NOT NULL AND {where.replace("run_id", "a.run_id")}
            GROUP BY ALL ORDER BY a.run_id, count(*) DESC, 3""",
        )
    except Exception as exc:  # a database from before run groups
        return f"== Run groups ==\n(none: {str(exc).splitlines()[0]})\n"
    text = HEADING
    if not procs:
        return text + NO_GROUPS
    text += format_table(
        ["group", "run", "label", "pid", "parent", "role", "steps", "slow", "peer"], procs
    )
    text += "\nCross-process causes of slow steps (a step that waited for another process: the late peer's own cause):\n"
    if not causes:
        return text + "(none: no slow step waited for a slow peer)\n"
    return text + format_table(
        [
            "run",
            "waited for run",
            "its cause",
            "steps",
            "peer ms",
            "max hops",
            "max late ms",
            "wait",
        ],
        causes,
    )
