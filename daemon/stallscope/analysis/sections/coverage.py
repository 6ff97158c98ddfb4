"""Which probe watched which run, and for how much of it: the report's and
`status`'s view of the `coverage` table.

A component of a step is only as good as the probe that measured it: a probe
loaded after a run started, a syscall probe outside its diagnosis window, or
a daemon restarted mid-run leave steps that nothing looked at (their
components are NULL, a slow one is `uncovered`). This section says so per
run and probe, so that "no preemption" is never read where "not watched" is
meant. Read-only; no per-step work beyond one grouped scan.
"""

from stallscope.analysis.formatting import format_table

# For `stallscope status`: the latest coverage of each run and probe.
STATUS_SQL = (
    "SELECT run_id, probe, count(*) AS intervals, "
    "round(sum(coalesce(end_ns, (SELECT max(end_ns) FROM spans s WHERE s.run_id = c.run_id)) "
    "- start_ns) / 1e9, 3) AS covered_s, bool_or(end_ns IS NULL) AS covering_now "
    "FROM coverage c GROUP BY run_id, probe ORDER BY run_id DESC, probe LIMIT 60"
)


def coverage_section(con, where):
    """Per run and probe: intervals, the share of the run's step span covered,
    how late the first cover began, and the run's `uncovered` slow steps."""
    cur = con.execute(
        f"""
        WITH r AS (
            SELECT run_id, min(start_ns) AS s0, max(end_ns) AS s1
            FROM _step WHERE {where} GROUP BY run_id
        ), c AS (
            SELECT r.run_id, c.probe, count(*) AS intervals,
                   sum(greatest(0, least(coalesce(c.end_ns, r.s1), r.s1)
                                   - greatest(c.start_ns, r.s0))) AS covered_ns,
                   greatest(0, min(c.start_ns) - any_value(r.s0)) AS late_ns,
                   any_value(r.s1 - r.s0) AS span_ns
            FROM r JOIN coverage c USING (run_id)
            GROUP BY r.run_id, c.probe
        ), u AS (
            SELECT run_id, count(*) AS uncovered
            FROM step_attribution WHERE {where} AND cause = 'uncovered' GROUP BY run_id
        )
        SELECT c.run_id, c.probe, c.intervals,
               round(100.0 * c.covered_ns / nullif(c.span_ns, 0), 1),
               round(c.late_ns / 1e6, 1), coalesce(u.uncovered, 0)
        FROM c LEFT JOIN u USING (run_id)
        ORDER BY c.run_id, c.probe"""
    )
    rows = cur.fetchall()
    text = "== Probe coverage (share of each run's steps that each probe watched) ==\n"
    if not rows:
        return text + "(no coverage recorded: a database from before coverage, or no probe ran)\n"
    return text + format_table(
        ["run", "probe", "intervals", "covered %", "first cover after ms", "uncovered slow steps"],
        rows,
    )
