"""The slow rule and the cause rule of step_attribution, at their edges."""

import random

import pytest
from db import (
    MS,
    add_gc,
    add_migrations,
    add_offcpu,
    add_run,
    add_span,
    add_steps,
    attribution,
    new_db,
    normal_steps,
)

PID, TID = 100, 11


def one_slow_step(con, slow_ms=15, at=1000, run_id=1, pid=PID, tid=TID):
    """Nine 10 ms steps (baseline 10 ms) and one step of slow_ms at `at` ms."""
    add_run(con, run_id, pid)
    add_steps(con, run_id, tid, normal_steps(0, 9) + [(at, at + slow_ms)])
    return at


def slow_row(con, run_id=1):
    rows = [r for r in attribution(con, f"run_id = {run_id}") if r["duration_ns"] != 10 * MS]
    assert len(rows) == 1
    return rows[0]


def test_no_gc_pass_means_never_gc():
    con = new_db()
    at = one_slow_step(con)
    # a gen-2 pass at the same instant, but in another run, and one in this
    # run that ends exactly when the slow step starts: neither overlaps it
    add_run(con, 2, 200)
    add_gc(con, 2, 21, 2, at, at + 15)
    add_gc(con, 1, TID, 2, at - 30, at)
    row = slow_row(con)
    assert row["slow"] and row["gc_ns"] == 0 and row["gc_generation"] is None
    assert row["cause"] == "unexplained"
    assert all(r["cause"] != "gc" for r in attribution(con))


def test_gc_on_another_thread_of_the_run_stalls_the_step():
    con = new_db()
    at = one_slow_step(con)
    add_gc(con, 1, TID + 5, 2, at + 2, at + 6)  # 4 ms of the 5 ms excess
    row = slow_row(con)
    assert row["gc_ns"] == 4 * MS and row["gc_generation"] == 2 and row["cause"] == "gc"


def test_empty_sched_and_gpu_tables():
    con = new_db()
    at = one_slow_step(con, slow_ms=20)
    add_gc(con, 1, TID, 1, at + 1, at + 7)  # 6 ms of 10 ms excess
    rows = attribution(con)
    assert len(rows) == 10
    for r in rows:
        assert (
            r["preempted_ns"],
            r["blocked_ns"],
            r["runq_ns"],
            r["migrations"],
            r["gpu_clock_ns"],
        ) == (0, 0, 0, 0, 0)
        assert r["sm_clock_min_mhz"] is None and r["clock_event_reasons"] is None
    assert slow_row(con)["cause"] == "gc"
    assert [r["cause"] for r in rows if r["duration_ns"] == 10 * MS] == [None] * 9


@pytest.mark.parametrize(
    "blocked_ns, cause",
    [
        (2 * MS, "blocked"),  # exactly half of the 4 ms excess
        (2 * MS - 1, "unexplained"),  # one ns short of half
    ],
)
def test_exactly_half_boundary(blocked_ns, cause):
    con = new_db()
    at = one_slow_step(con, slow_ms=14)  # excess 4 ms
    con.execute(
        "INSERT INTO offcpu (pid, tid, start_ns, end_ns, preempted, cpu) VALUES (?, ?, ?, ?, false, 0)",
        [PID, TID, (at + 5) * MS, (at + 5) * MS + blocked_ns],
    )
    row = slow_row(con)
    assert row["excess_ns"] == 4 * MS and row["blocked_ns"] == blocked_ns
    assert row["cause"] == cause


def test_slow_boundary_and_parameter():
    con = new_db()
    one_slow_step(con, slow_ms=12)  # exactly 1.2 x baseline: not slow
    assert slow_row(con)["slow"] is False and slow_row(con)["cause"] is None
    con.execute("SET VARIABLE step_slow_factor = 1.1")
    assert slow_row(con)["slow"] is True and slow_row(con)["cause"] == "unexplained"
    con.execute("RESET VARIABLE step_slow_factor")
    assert slow_row(con)["slow"] is False


@pytest.mark.parametrize("count, cause", [(49, "unexplained"), (50, "migration")])
def test_migration_rule(count, cause):
    """migration_ns = migrations x 50 us; 50 of them are exactly half of 5 ms."""
    con = new_db()
    at = one_slow_step(con)  # excess 5 ms
    add_migrations(con, PID, TID, [at + 1 + i * 0.1 for i in range(count)])
    row = slow_row(con)
    assert row["migrations"] == count and row["migration_ns"] == count * 50_000
    assert row["cause"] == cause


def test_migration_cost_parameter_and_tie_with_preemption():
    con = new_db()
    at = one_slow_step(con)  # excess 5 ms
    add_migrations(con, PID, TID, [at + 1 + i * 0.1 for i in range(10)])
    assert slow_row(con)["cause"] == "unexplained"  # 10 x 50 us = 0.5 ms
    con.execute("SET VARIABLE step_migration_cost_ns = 300000")
    assert slow_row(con)["cause"] == "migration"  # 10 x 300 us = 3 ms
    add_offcpu(con, PID, TID, at + 10, at + 13, True)  # 3 ms preempted: a tie
    assert slow_row(con)["cause"] == "preemption"  # the more specific wins


def test_gc_inside_submit_is_gc_not_submit():
    con = new_db()
    add_run(con, 1, PID)
    steps = normal_steps(0, 9) + [(1000, 1040)]
    add_steps(con, 1, TID, steps)
    for s, e in steps:
        add_span(con, 1, TID, "submit", s + 1, s + 2 if e - s == 10 else s + 33, depth=1)
    add_gc(con, 1, TID, 2, 1003, 1031)  # 28 ms GC inside a 32 ms submit
    row = slow_row(con)
    assert row["submit_excess_ns"] == 31 * MS and row["gc_ns"] == 28 * MS
    assert row["submit_host_ns"] == 3 * MS and row["cause"] == "gc"


def _union(intervals):
    """Disjoint islands of a list of (start, end)."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _inter(a, b, islands):
    return sum(max(0, min(b, e) - max(a, s)) for s, e in islands)


def brute_force(steps, gcs, offs):
    """Per step (run, tid, start, end), by direct intersection: raw off-CPU
    time (preempted, blocked) and the disjoint components (gc; preempted and
    blocked less the GC time inside them)."""
    raw, parts = {}, {}
    for run, tid, s, e in steps:
        gc = _union(
            [
                (max(gs, s), min(ge, e))
                for (grun, gs, ge) in gcs
                if grun == run and gs < e and s < ge
            ]
        )
        pre = blk = pre_net = blk_net = 0
        for otid, os_, oe, p in offs:
            a, b = max(os_, s), min(oe, e)
            if otid != tid or a >= b:
                continue
            net = (b - a) - _inter(a, b, gc)
            if p:
                pre, pre_net = pre + b - a, pre_net + net
            else:
                blk, blk_net = blk + b - a, blk_net + net
        raw[(run, tid, s)] = (pre, blk)
        parts[(run, tid, s)] = (sum(ie - is_ for is_, ie in gc), pre_net, blk_net)
    return raw, parts


@pytest.mark.parametrize("seed", range(5))
def test_interval_joins_match_brute_force(seed):
    """Random steps on two threads; GC and off-CPU intervals of any length,
    including ones that straddle or cover several steps."""
    rnd = random.Random(seed)
    con = new_db()
    add_run(con, 1, PID)
    steps, gcs, offs = [], [], []
    for tid in (11, 12):
        t = rnd.randint(0, 5)
        for _ in range(30):
            s = t + rnd.randint(0, 3)
            e = s + rnd.randint(1, 8)
            steps.append((1, tid, s * MS, e * MS))
            t = e
    # GC passes of one process never overlap (a collection stops every
    # thread): 25 of any length, one after another with random gaps
    t = 0
    for _ in range(25):
        s = t + rnd.randint(0, 8 * MS)
        t = s + rnd.randint(1, 20 * MS)
        gcs.append((1, s, t))
    for _ in range(60):
        tid = rnd.choice((11, 12))
        s = rnd.randint(0, 200) * MS + rnd.randint(0, MS)
        offs.append((tid, s, s + rnd.randint(1, 25 * MS), rnd.random() < 0.5))
    for run, tid, s, e in steps:
        add_span(con, run, tid, "step", s / MS, e / MS)
    for _run, s, e in gcs:
        con.execute(
            "INSERT INTO gc_events (run_id, tid, generation, start_ns, end_ns) VALUES (1, 99, 0, ?, ?)",
            [s, e],
        )
    for tid, s, e, p in offs:
        con.execute(
            "INSERT INTO offcpu (pid, tid, start_ns, end_ns, preempted, cpu) VALUES (?, ?, ?, ?, ?, 0)",
            [PID, tid, s, e, p],
        )
    want_raw, want_parts = brute_force(steps, gcs, offs)
    rows = attribution(con)
    got = {
        (r["run_id"], r["tid"], r["start_ns"]): (r["gc_ns"], r["preempted_ns"], r["blocked_ns"])
        for r in rows
    }
    assert got == want_parts
    start = {(r["run_id"], r["tid"], r["step_idx"]): r["start_ns"] for r in rows}
    sched = {
        (run, tid, start[(run, tid, idx)]): (pre, blk)
        for run, tid, idx, pre, blk in con.execute(
            "SELECT run_id, tid, step_idx, preempted_ns, blocked_ns FROM step_sched"
        ).fetchall()
    }
    assert sched == {k: v for k, v in want_raw.items() if v != (0, 0)}
