"""The report's request section on the requests fixture (tests/queries/
fixtures/requests.sql): per run the TTFT and ITL distributions with the
causes of their tails, and the requests hurt most as sentences; a report of
runs without request events has no such section."""

from pathlib import Path

from db import add_run, add_steps, new_db

from stallscope.analysis.report import build_report
from stallscope.analysis.sections.requests import request_section

FIXTURE = Path(__file__).parent / "fixtures" / "requests.sql"


def requests_db():
    con = new_db()
    con.execute(FIXTURE.read_text())
    return con


def test_distributions_and_tail_causes_per_run():
    text = request_section(requests_db(), "TRUE")
    lines = text.splitlines()
    assert lines[0] == "== Requests =="
    (row,) = [ln for ln in lines if ln.split()[:1] == ["1"]]
    cells = row.split()
    # requests, finished, aborted; TTFT p50/p90/p99; ITL p50/p90/p99/max; e2e p99
    assert cells[1:4] == ["4", "2", "1"]
    assert cells[4:8] == ["14.9", "17.3", "17.84", "10.0"]
    assert cells[8:12] == ["50.0", "50.0", "50.0", "104.51"]
    assert " ".join(cells[12:]) == "not_slow 1 not_scheduled 1, preempted 1"


def test_the_requests_hurt_most_say_why():
    text = request_section(requests_db(), "TRUE")
    hurt = text.split("Hurt most (longest inter-token gap):\n")[1].splitlines()
    assert hurt == [
        "  run 1, request req-b: worst inter-token gap 50.0 ms, at step 4, "
        "the engine preempted the request (TTFT 4.9 ms)",
        "  run 1, request 3: worst inter-token gap 50.0 ms, at step 4, steps ran without it "
        "(TTFT 17.9 ms)",
        "  run 1, request 1: worst inter-token gap 40.0 ms, at step 3, cause gc (TTFT 14.9 ms)",
        # the engine core's request of a run group, TTFT from the caller's arrival
        "  run 3, request 7: worst inter-token gap 10.0 ms, its token was recorded outside "
        "any step (TTFT 9.9 ms)",
    ]


def test_runs_without_requests_have_no_section():
    con = new_db()
    add_run(con, 1, 100)
    add_steps(con, 1, 11, [(0, 10), (10, 20)])
    assert request_section(con, "TRUE") == ""
    assert "== Requests ==" not in build_report(con)
    assert "== Requests ==" in build_report(requests_db())
