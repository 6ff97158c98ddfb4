"""The report's and status's coverage section: the share of a run's steps each
probe watched, how late it began, and the run's `uncovered` slow steps."""

from db import MS, add_run, add_steps, new_db

from stallscope.analysis.access import STATUS_QUERIES
from stallscope.analysis.sections.coverage import STATUS_SQL, coverage_section


def test_partial_and_late_coverage_is_reported_per_probe():
    con = new_db()
    add_run(con, 1, 100)
    # 100 steps of 10 ms back to back: the run's steps span 0..1000 ms.
    add_steps(con, 1, 7, [(i * 10, i * 10 + 9) for i in range(100)])
    con.execute(
        "INSERT INTO coverage (run_id, probe, start_ns, end_ns) VALUES (1, 'sched', ?, NULL), (1, 'syscalls', ?, ?), "
        "(1, 'syscalls', ?, ?)",
        [250 * MS, 100 * MS, 200 * MS, 600 * MS, 700 * MS],
    )
    text = coverage_section(con, "TRUE")
    rows = {
        line.split()[1]: line.split() for line in text.splitlines() if line.strip().startswith("1 ")
    }
    # sched: from 250 ms to the end (999 ms): 749 of 999 ms = 75.0 %, 250 ms late.
    assert rows["sched"][2:5] == ["1", "75.0", "250.0"]
    # syscalls: two windows of 100 ms = 20.0 % of the span, first at 100 ms.
    assert rows["syscalls"][2:5] == ["2", "20.0", "100.0"]
    assert STATUS_SQL in [sql for _, sql in STATUS_QUERIES]
    status = con.execute(STATUS_SQL).fetchall()
    assert [(r[1], r[2], r[4]) for r in status] == [("sched", 1, True), ("syscalls", 2, False)]


def test_no_coverage_rows_says_so():
    con = new_db()
    add_run(con, 1, 100)
    add_steps(con, 1, 7, [(0, 9), (10, 19)])
    assert "no coverage recorded" in coverage_section(con, "TRUE")
