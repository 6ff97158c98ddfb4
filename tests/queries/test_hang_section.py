"""The report's hang section: each dump of the hang watchdog with, per
thread, its kernel state and blocking frame (the innermost Python frame and
its caller), on the hang fixture (tests/queries/fixtures/hang.sql)."""

from pathlib import Path

from db import add_run, add_steps, new_db

from stallscope.analysis.report import build_report
from stallscope.analysis.sections.hangs import MAX_DUMPS, hang_section

FIXTURE = Path(__file__).parent / "fixtures" / "hang.sql"


def hang_db():
    con = new_db()
    add_run(con, 1, 100, label="engine-a")
    add_steps(con, 1, 11, [(0, 9), (4790, 4800), (14000, 14010)])
    con.execute(FIXTURE.read_text())
    return con


def _thread_lines(text):
    """{tid: line} of the thread rows (pid, tid, ...)."""
    return {
        ln.split()[1]: ln
        for ln in text.splitlines()
        if len(ln.split()) > 2 and ln.split()[1] in ("11", "12", "13", "21")
    }


def test_each_thread_has_its_state_and_blocking_frame():
    text = hang_section(hang_db(), "TRUE")
    head = text.split("\n", 2)[2]
    assert head.startswith("dump 7: run 1 (engine-a), pid 100, no step end for 5.2 s when detected")
    assert "recovered after 9.2 s; 3 threads" in head and "no step end for 5.2 s" in head
    lines = _thread_lines(text)
    engine = lines["11"].split()
    assert engine[0] == "100" and engine[2:5] == ["engine", "S", "futex_do_wait"]
    assert engine[5] == "proc_mem"
    assert "Lock.acquire (engine.py:40)" in lines["11"] and "step (engine.py:12)" in lines["11"]
    assert lines["11"].index("Lock.acquire") < lines["11"].index("step (engine.py")
    assert "pipe_read" in lines["12"] and "reader (engine.py:30)" in lines["12"]
    assert "(no Python frame known)" in lines["13"]
    assert "unused" not in text  # a sampler frame no dump names


def test_a_run_group_peers_threads_follow_the_hung_process():
    con = hang_db()
    con.execute(
        "INSERT INTO hang_dump_frames (dump_id, run_id, pid, tid, thread_name, state, wchan, "
        "source, depth, frame_id) VALUES (7, 1, 200, 21, 'worker-rank0', 'S', 'pipe_read', "
        "'proc_mem', 0, -3)"
    )
    text = hang_section(con, "TRUE")
    lines = _thread_lines(text)
    assert lines["21"].split()[:3] == ["200", "21", "worker-rank0"]
    order = [ln.split()[1] for ln in text.splitlines() if ln.split()[1:2] in (["11"], ["21"])]
    assert order == ["11", "21"]  # the hung process's own threads first


def test_the_report_has_the_section_and_a_hung_run_says_so():
    con = hang_db()
    con.execute("UPDATE hang_dumps SET recovered_ns = NULL, lacks = 'rate limit: 1 dump a minute'")
    text = build_report(con)
    section = text.split("== Hangs")[1].split("\n== ")[0]
    assert "hung or left" in section and "lacks: rate limit: 1 dump a minute" in section


def test_only_the_selected_runs_and_the_latest_dumps():
    con = hang_db()
    assert "no run stopped making progress" in hang_section(con, "run_id IN (2)")
    for i in range(MAX_DUMPS + 3):
        con.execute(
            "INSERT INTO hang_dumps (dump_id, run_id, pid, detected_ns, reason, threshold_ns, "
            "last_step_end_ns, threads) VALUES (?, 1, 100, ?, 'r', 1, ?, 0)",
            [100 + i, 20_000_000_000 + i, 19_000_000_000 + i],
        )
    text = hang_section(con, "TRUE")
    shown = [int(ln.split()[1].rstrip(":")) for ln in text.splitlines() if ln.startswith("dump ")]
    assert shown == list(range(100 + MAX_DUMPS + 2, 102, -1))  # newest first, MAX_DUMPS of them


def test_a_database_without_the_tables_says_so():
    import duckdb

    assert "(none:" in hang_section(duckdb.connect(), "TRUE")
