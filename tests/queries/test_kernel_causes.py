"""Each precedence rule of step_attribution on the kernel and engines
fixtures: one slow step per cause, the who-columns, idle and stage-less
steps, and the work baseline (the goldens hold every column; these name
the rule each row proves)."""

from pathlib import Path

import pytest

from helpers.schema_db import fresh_db
from stallscope.store import views

FIXTURES = Path(__file__).parent / "fixtures"
MS = 1_000_000


def load(name):
    con = fresh_db()
    con.execute((FIXTURES / f"{name}.sql").read_text())
    assert views.create_views(con) == []
    return con


def rows(con, where):
    cur = con.execute(f"SELECT * FROM step_attribution WHERE {where} ORDER BY run_id, start_ns")
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


@pytest.fixture(scope="module")
def kernel():
    return load("kernel")


@pytest.mark.parametrize(
    "start_ms, cause, part, part_ms",
    [
        (200, "gc", "gc_ns", 4.0),  # GC on thread 12 while 11 waits: gc, not blocked/lock
        (220, "lock", "lock_ns", 4.0),
        (240, "peer", "peer_ns", 4.0),
        (260, "runqueue", "runq_ns", 3.5),
        (280, "preemption", "preempted_ns", 4.0),
        (300, "throttled", "throttled_ns", 4.0),
        (320, "irq", "irq_ns", 3.0),
        (340, "steal", "steal_ns", 4.0),  # CPU 0's steal only
        (360, "page_fault", "page_fault_ns", 4.0),
        (380, "syscall", "syscall_ns", 3.45),  # 5.25 ms in syscalls less 1.8 ms asleep
        (400, "lock", "lock_ns", 3.49),  # a timed-out GIL wait chained to the holder's wake-up
        (420, "blocked", "blocked_ns", 4.0),
        (440, "uncovered", None, None),
        (460, "unexplained", None, None),
    ],
)
def test_one_cause_per_step(kernel, start_ms, cause, part, part_ms):
    (r,) = rows(kernel, f"run_id = 1 AND start_ns = {start_ms * MS}")
    assert r["slow"] and r["excess_ns"] == 5 * MS
    assert r["cause"] == cause
    if part:
        assert r[part] == round(part_ms * MS) and r["cause_ns"] == r[part]


def test_components_are_disjoint(kernel):
    parts = (
        "gc_ns lock_ns peer_ns runq_ns throttled_ns preempted_ns blocked_ns irq_ns steal_ns "
        "page_fault_ns syscall_ns migration_ns submit_host_ns gpu_clock_ns"
    ).split()
    for r in rows(kernel, "TRUE"):
        assert sum(r[p] or 0 for p in parts) <= r["duration_ns"], r
        assert all((r[p] or 0) >= 0 for p in parts), r


def test_gc_takes_the_wait_it_explains(kernel):
    (k1,) = rows(kernel, f"run_id = 1 AND start_ns = {200 * MS}")
    # 5 ms off CPU: 4 ms of it under the GC pass, 0.9 ms asleep after it, 0.1 ms on the run queue
    assert (k1["gc_ns"], k1["lock_ns"], k1["runq_ns"], k1["blocked_ns"]) == (
        4 * MS,
        900_000,
        100_000,
        0,
    )
    raw = kernel.execute(
        f"SELECT blocked_ns FROM step_sched WHERE run_id = 1 AND step_idx = {k1['step_idx']}"
    ).fetchone()
    assert raw == (5 * MS,)  # step_sched keeps the raw off-CPU time


def test_who(kernel):
    by_start = {r["start_ns"] // MS: r for r in rows(kernel, "run_id = 1 AND slow")}
    assert (by_start[220]["waker_tid"], by_start[220]["waker_comm"]) == (13, "tokenizer")
    assert (by_start[240]["waker_comm"], by_start[240]["waker_run_id"]) == ("worker", 2)
    assert by_start[260]["waker_run_id"] is None  # pid 999 is not traced
    assert (by_start[280]["preemptor_pid"], by_start[280]["preemptor_comm"]) == (300, "hog")
    assert (by_start[400]["waker_tid"], by_start[400]["waker_comm"]) == (12, "bg")
    assert by_start[420]["waker_tid"] is None  # a timer
    assert by_start[380]["top_syscall"] == "ioctl"
    assert by_start[360]["page_faults"] == 400


def test_uncovered_components_are_null(kernel):
    (k13,) = rows(kernel, f"run_id = 1 AND start_ns = {440 * MS}")
    assert k13["uncovered_probes"] == ["sched"]
    assert k13["preempted_ns"] is None and k13["blocked_ns"] is None and k13["waker_tid"] is None
    assert k13["irq_ns"] == 0 and k13["syscall_ns"] == 0  # those probes covered it
    # run 2 has no coverage rows: sched counts as covering, the others as off
    r2 = rows(kernel, "run_id = 2")
    assert all(r["blocked_ns"] is not None and r["syscall_ns"] is None for r in r2)
    assert all(r["irq_ns"] is None and r["page_faults"] is None for r in r2)


def test_idle_steps_are_kept_but_never_slow(kernel):
    idle = rows(kernel, "idle")
    assert [r["duration_ns"] for r in idle] == [100 * MS] * 3
    assert all(not r["slow"] and r["cause"] is None and r["baseline_ns"] is None for r in idle)
    runs = kernel.execute(
        "SELECT idle_steps, long_steps, max_step_ms, p99_step_ms FROM seed_runs WHERE run_id = 1"
    ).fetchone()
    assert runs[0] == 3 and runs[1] == 0 and runs[2] == 15.0 and runs[3] < 100


def test_stageless_engine(kernel):
    (g,) = kernel.execute(
        "SELECT stage, step_ms, in_prefill, stall FROM seed_gen2 WHERE run_id = 2"
    ).fetchall()
    assert g == (None, 40.0, False, True)  # a step without a stage is a step
    (r,) = rows(kernel, "run_id = 2 AND slow")
    assert r["stage"] is None and r["cause"] == "gc" and r["waker_comm"] == "gc-thread"
    assert not any(r["idle"] for r in rows(kernel, "run_id = 2"))  # batch 0 = unknown here
    gen2_run1 = "SELECT in_prefill, stall FROM seed_gen2 WHERE run_id = 1"
    assert kernel.execute(gen2_run1).fetchall() == [(False, True)]
    kernel.execute("SET VARIABLE step_prefill_stage = 'recurrent'")  # the stage name is a parameter
    try:
        assert kernel.execute(gen2_run1).fetchall() == [(True, False)]
    finally:
        kernel.execute("RESET VARIABLE step_prefill_stage")


def test_work_baseline():
    con = load("engines")
    slow = rows(con, "slow")
    assert [(r["step_idx"], r["cause"]) for r in slow] == [(30, "unexplained"), (40, "gc")]
    assert {r["baseline_model"] for r in rows(con, "NOT idle")} == {"work_fit"}
    # keyed on batch alone, the long-context steps would have been slow
    (batch_base,) = con.execute("SELECT baseline_ns FROM step_baseline").fetchone()
    assert (
        con.execute(
            f"SELECT count(*) FROM step_attribution WHERE NOT idle AND duration_ns > 1.2 * {batch_base}"
        ).fetchone()[0]
        >= 10
    )
    assert len(rows(con, "idle")) == 2 and not any(r["slow"] for r in rows(con, "idle"))
    # enough steps per work bucket: the bucket median takes over
    con.execute("SET VARIABLE step_baseline_min_steps = 2")
    models = {r["baseline_model"] for r in rows(con, "NOT idle")}
    assert "work_bucket" in models


def test_report_summary_and_compare_leave_idle_steps_out(kernel, tmp_path):
    from stallscope.analysis.compare import compare_runs
    from stallscope.analysis.report import build_report
    from stallscope.analysis.summary import build_summary

    rec = [ln.split() for ln in build_summary(kernel).splitlines() if ln.startswith("recurrent")]
    assert rec[0] == ["recurrent", "44", "3", "10.0", "15.0", "15.0"]  # steps, idle, p50/p99/max
    text = build_report(kernel, out_dir=str(tmp_path))
    # the unexplained share comes before the cause table; uncovered is counted apart
    slow = text.split("== Slow steps")[1]
    assert slow.index(
        "Unexplained share of slow steps: 1 of 15 (6.7%); 1 more uncovered"
    ) < slow.index("top cause")
    for cause in ("lock", "peer", "runqueue", "throttled", "irq", "steal", "page_fault", "syscall"):
        assert cause in slow.split("\n")[2]  # a column of the cause table
    who = text.split("== Top preemptors and wakers")[1]
    assert "hog" in who and "tokenizer" in who and "worker" in who
    gen2 = text.split("== Generation-2 collections ==")[1].split("==")[0]
    assert "2 stalled a non-prefill step" in gen2 and "0 overlapped no step" in gen2
    assert (tmp_path / "run_1_steps.png").exists() and (tmp_path / "run_2_gen2_1.png").exists()
    cmp = compare_runs(kernel, 1, 2)
    stages = cmp.split("per stage ==")[1].split("==")[0]
    row = [ln.split() for ln in stages.splitlines() if ln.startswith("recurrent")][0]
    assert row[1:4] == ["44", "10.0", "15.0"]  # idle steps out of the count, p50 and p99


def test_preemptor_is_the_task_with_the_most_time_not_the_longest_interval():
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from db import add_run, add_steps, new_db, normal_steps

    con = new_db()
    add_run(con, 1, 100)
    add_steps(con, 1, 11, normal_steps(0, 9) + [(1000, 1015)])
    for s, e, pid, comm in (
        (1001, 1002, 7, "kworker"),
        (1003, 1004, 7, "kworker"),
        (1005, 1006, 7, "kworker"),
        (1008, 1010.5, 8, "hog"),  # the longest interval, but less time in all
    ):
        con.execute(
            "INSERT INTO offcpu (pid, tid, start_ns, end_ns, preempted, cpu, preemptor_pid, "
            "preemptor_tid, preemptor_comm) VALUES (100, 11, ?, ?, true, 0, ?, ?, ?)",
            [int(s * MS), int(e * MS), pid, pid, comm],
        )
    (r,) = [r for r in rows(con, "slow")]
    assert r["cause"] == "preemption" and r["preempted_ns"] == int(5.5 * MS)
    assert (r["preemptor_pid"], r["preemptor_comm"]) == (7, "kworker")


@pytest.mark.parametrize("yielded", [True, False, None])
def test_a_yield_is_run_queue_wait_with_no_preemptor(yielded):
    """A spinning waiter that gives its CPU away in sched_yield() was not
    preempted by what ran meanwhile (a daemon thread, on vLLM's engine core):
    its interval is run-queue wait and names no preemptor. A real preemption,
    and a yield the probe could not tell (NULL), stay `preemption`."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from db import add_run, add_steps, new_db, normal_steps

    con = new_db()
    add_run(con, 1, 100)
    add_steps(con, 1, 11, normal_steps(0, 9) + [(1000, 1015)])
    for s, e in ((1001, 1003), (1004, 1006.5)):
        con.execute(
            "INSERT INTO offcpu (pid, tid, start_ns, end_ns, preempted, yielded, cpu, "
            "preemptor_pid, preemptor_tid, preemptor_comm) "
            "VALUES (100, 11, ?, ?, true, ?, 0, 300, 301, 'stallscope/stor')",
            [int(s * MS), int(e * MS), yielded],
        )
    con.execute(  # the run-queue rows the sched probe writes for the same waits
        "INSERT INTO runq (pid, tid, start_ns, end_ns, cpu) VALUES "
        f"(100, 11, {1001 * MS}, {1003 * MS}, 0), (100, 11, {1004 * MS}, {int(1006.5 * MS)}, 0)"
    )
    (r,) = rows(con, "slow")
    if yielded:
        assert (r["cause"], r["runq_ns"], r["preempted_ns"]) == ("runqueue", int(4.5 * MS), 0)
        assert r["preemptor_pid"] is None and r["preemptor_comm"] is None
    else:
        assert (r["cause"], r["runq_ns"], r["preempted_ns"]) == ("preemption", 0, int(4.5 * MS))
        assert (r["preemptor_pid"], r["preemptor_comm"]) == (300, "stallscope/stor")


def test_a_lock_chain_runs_through_unknown_wakers_and_preemptions():
    """A GIL wait as the kernel probe saw it on a loaded host: a timed-out
    wait, a wait whose waker it could not name, a preemption, then the
    holder's wake-up, each a few microseconds after the last."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from db import add_run, add_steps, new_db, normal_steps

    con = new_db()
    add_run(con, 1, 100)
    add_steps(con, 1, 11, normal_steps(0, 9) + [(1000, 1015)])
    for s, e, pre, wtid, wcomm, irq, ppid in (
        (1001, 1004, False, None, None, True, None),  # timed out
        (1004.01, 1004.31, False, None, None, None, None),  # waker unknown
        (1004.32, 1004.52, True, None, None, None, 300),  # preempted by 'hog'
        (1004.53, 1005.03, False, 12, "holder", False, None),  # the holder lets go
        (1010, 1011, False, None, None, True, None),  # later: a plain timer sleep
    ):
        con.execute(
            "INSERT INTO offcpu (pid, tid, start_ns, end_ns, preempted, cpu, waker_pid, waker_tid, "
            "waker_comm, waker_irq, wakeup_ns, preemptor_pid, preemptor_comm) "
            "VALUES (100, 11, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?, 'hog')",
            [int(s * MS), int(e * MS), pre, 100 if wtid else None, wtid, wcomm, irq,
             None if pre else int(e * MS), ppid],
        )  # fmt: skip
    (r,) = rows(con, "slow")
    assert r["lock_ns"] == int(3.8 * MS) and r["preempted_ns"] == int(0.2 * MS)
    assert r["blocked_ns"] == 1 * MS and r["cause"] == "lock"
    assert (r["waker_tid"], r["waker_comm"]) == (12, "holder")


def test_a_daemon_thread_that_preempts_is_reported_like_any_other(tmp_path):
    """The report never filters the daemon out of its top preemptors: where
    one of its threads took the CPU from a slow step, it is named."""
    from stallscope.analysis.report import build_report

    con = fresh_db()
    sql = (FIXTURES / "kernel.sql").read_text()
    con.execute(sql.replace("300, 'hog'", "300, 'stallscope/stor'"))
    assert views.create_views(con) == []
    who = build_report(con, out_dir=str(tmp_path)).split("== Top preemptors and wakers")[1]
    line = next(ln for ln in who.splitlines() if "stallscope/stor" in ln)
    assert "preemptor" in line and "300" in line and "hog" not in who
