"""step_components (store/step_fill.py) against the recomputing views.

Every golden case is run with the table filled up to several points (none,
part, all of the steps) and must give its golden CSV, and the same rows as
with the table switched off (`step_components_table = false`: every step
computed from the source tables, as before the table existed). Late rows
(an off-CPU row, a GC pass, a run that makes a preemptor traced) must take
the filled steps they touch back, and steps whose lock chain is still open
must wait.
"""

import threading

import pytest
from tests.queries.test_golden import CASES, HERE, render

from helpers.schema_db import fresh_db
from stallscope.store import step_fill
from stallscope.store.step_fill import StepFiller

MS = 1_000_000
FAR = 10**18  # a `now` after every step: no settling wait


class FakeStore:
    """What the filler needs of the daemon's Store, on one in-memory database."""

    def __init__(self, con):
        self.con = con
        self.listeners = []

    def flush(self):
        pass

    def cursor(self):
        return self.con.cursor()

    def add_listener(self, fn):
        self.listeners.append(fn)

    def remove_listener(self, fn):
        self.listeners.remove(fn)


def fixture_db(name):
    con = fresh_db()
    con.execute((HERE / "fixtures" / f"{name}.sql").read_text())
    return con


def rows(con, sql):
    cur = con.execute(sql)
    return render([d[0] for d in cur.description], cur.fetchall())


def recomputed(con, sql):
    con.execute("SET VARIABLE step_components_table = false")
    try:
        return rows(con, sql)
    finally:
        con.execute("RESET VARIABLE step_components_table")


def filled(con):
    return con.execute("SELECT count(*) FROM step_components").fetchone()[0]


def case_fixture(path):
    return path.read_text().splitlines()[0].split(":", 1)[1].strip()


@pytest.mark.parametrize("fraction", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("case", CASES, ids=[p.stem for p in CASES])
def test_golden_case_with_filled_steps(case, fraction):
    con = fixture_db(case_fixture(case))
    ends = [r[0] for r in con.execute("SELECT end_ns FROM _step ORDER BY end_ns").fetchall()]
    filler = fill_to(con, fraction, ends)
    if fraction == 1.0:
        assert filled(con) == len(ends)  # every step is read from the table
    elif fraction > 0 and ends:  # (the GC-forensics cases have no steps)
        assert 0 < filled(con) < len(ends)
    text = case.read_text()
    expected = (HERE / "golden" / f"{case.stem}.csv").read_text()
    assert rows(con, text) == expected
    assert recomputed(con, text) == expected
    assert filler.steps_filled == filled(con)


def fill_to(con, fraction, ends):
    filler = StepFiller(FakeStore(con), settle_ns=0)
    if fraction > 0:
        whole = fraction == 1.0 or not ends
        filler.cycle(now_ns=FAR if whole else ends[int(fraction * len(ends))])
    return filler


ATTR = "SELECT * FROM step_attribution ORDER BY run_id, tid, step_idx"
# Every view that reads the stored components, at once.
ALL_STEP_VIEWS = (
    " UNION ALL ".join(
        f"SELECT '{v}' AS view, to_json(x)::VARCHAR AS row FROM {v} x"
        for v in ("step_attribution", "step_sched", "step_gc", "step_submit")
    )
    + " ORDER BY ALL"
)


def note(filler, con, table, where):
    filler.note_batch(table, con.sql(f"SELECT * FROM {table} WHERE {where}").to_arrow_table())


def test_filled_in_steps_as_time_passes_equals_the_view():
    con = fixture_db("kernel")
    filler = StepFiller(FakeStore(con), settle_ns=0)
    ends = [r[0] for r in con.execute("SELECT end_ns FROM _step ORDER BY end_ns").fetchall()]
    expected = recomputed(con, ATTR)
    for now in ends[::7] + [FAR]:
        filler.cycle(now_ns=now)
        assert rows(con, ATTR) == expected
    assert filled(con) == len(ends)


def test_settle_time_keeps_recent_steps_unfilled():
    con = fixture_db("basic")
    ends = [r[0] for r in con.execute("SELECT end_ns FROM _step ORDER BY end_ns").fetchall()]
    filler = StepFiller(FakeStore(con), settle_ns=10**9)
    filler.cycle(now_ns=ends[-1] + 10**9 - 1)  # the last step ended under 1 s ago
    stored = {r[0] for r in con.execute("SELECT end_ns FROM step_components").fetchall()}
    assert ends[-1] not in stored and max(stored) < ends[-1]
    assert rows(con, ATTR) == recomputed(con, ATTR)
    filler.cycle(now_ns=ends[-1] + 10**9)
    assert filled(con) == len(ends)


@pytest.mark.parametrize(
    "table,insert,where",
    [
        # k12 (420-435 ms) gets 2 more ms of sleep: a row the ring buffer gave late
        (
            "offcpu",
            "INSERT INTO offcpu (pid, tid, start_ns, end_ns, preempted, cpu) "
            f"VALUES (100, 11, {430 * MS}, {432 * MS}, false, 0)",
            f"start_ns = {430 * MS}",
        ),
        # a GC pass on another thread of run 1 during k14 (460-475 ms)
        (
            "gc_events",
            "INSERT INTO gc_events (run_id, tid, generation, start_ns, end_ns, collected, "
            f"uncollectable) VALUES (1, 12, 2, {462 * MS}, {470 * MS}, 5, 0)",
            f"start_ns = {462 * MS}",
        ),
        # a late run-queue wait and a migration inside k14
        (
            "runq",
            f"INSERT INTO runq (pid, tid, start_ns, end_ns, cpu) VALUES (100, 11, {461 * MS}, "
            f"{469 * MS}, 0)",
            f"start_ns = {461 * MS}",
        ),
        # a submit call inside an early step of run 2
        (
            "spans",
            "INSERT INTO spans (run_id, tid, kind, stage, batch, start_ns, end_ns, depth, seq) "
            f"VALUES (2, 21, 'submit', NULL, 0, {2001 * MS}, {2004 * MS}, 1, 0)",
            f"kind = 'submit' AND start_ns = {2001 * MS}",
        ),
    ],
    ids=["offcpu", "gc", "runq", "submit"],
)
def test_late_row_takes_filled_steps_back(table, insert, where):
    con = fixture_db("kernel")
    filler = StepFiller(FakeStore(con), settle_ns=0)
    filler.cycle(now_ns=FAR)
    before = rows(con, ALL_STEP_VIEWS)
    con.execute(insert)
    # the stored rows are stale now: the view would still show the old step
    assert rows(con, ALL_STEP_VIEWS) == before
    assert recomputed(con, ALL_STEP_VIEWS) != before
    note(filler, con, table, where)
    filler.cycle(now_ns=FAR)
    assert filler.steps_reset > 0
    assert rows(con, ALL_STEP_VIEWS) == recomputed(con, ALL_STEP_VIEWS)
    assert filled(con) == con.execute("SELECT count(*) FROM _step").fetchone()[0]


def test_new_run_of_a_preemptor_takes_its_steps_back():
    con = fixture_db("kernel")
    filler = StepFiller(FakeStore(con), settle_ns=0)
    filler.start()  # remembers the runs known now
    try:
        filler.cycle(now_ns=FAR)
        before = rows(con, ATTR)
        # pid 300 'hog' (k5's preemptor) connects a probe: it is traced now
        con.execute("INSERT INTO runs (run_id, pid, label) VALUES (3, 300, 'hog')")
        assert recomputed(con, ATTR) != before
        filler.cycle(now_ns=FAR)
        assert rows(con, ATTR) == recomputed(con, ATTR)
        k5 = con.execute(
            "SELECT preemptor_run_id FROM step_attribution WHERE run_id = 1 AND start_ns = ?",
            [280 * MS],
        ).fetchone()
        assert k5 == (3,)
    finally:
        filler.stop()


def test_open_lock_chain_waits_for_the_row_that_closes_it():
    con = fresh_db()
    con.execute("INSERT INTO runs (run_id, pid, label) VALUES (1, 100, 'engine')")
    for i in range(8):  # 10 ms steps every 20 ms; the last one 240-250 ms
        con.execute(
            "INSERT INTO spans (run_id, tid, kind, stage, batch, start_ns, end_ns, depth, seq) "
            "VALUES (1, 11, 'step', 'r', 4, ?, ?, 0, ?)",
            [(100 + 20 * i) * MS, (110 + 20 * i) * MS, i],
        )
    # in the last step: a wait that timed out (no waker) and ended 5 us before
    # the step did; nothing after it yet: the chain may still end with a
    # thread's wake-up, which would make the wait a lock wait
    con.execute(
        "INSERT INTO offcpu (pid, tid, start_ns, end_ns, preempted, cpu, wakeup_ns, waker_irq) "
        "VALUES (100, 11, ?, ?, false, 0, ?, true)",
        [241 * MS, 250 * MS - 5_000, 250 * MS - 5_000],
    )
    filler = StepFiller(FakeStore(con), settle_ns=MS)
    filler.cycle(now_ns=251 * MS)  # the step has settled, the chain row's reach has not
    assert con.execute("SELECT max(step_idx) FROM step_components").fetchone()[0] == 6
    assert rows(con, ATTR) == recomputed(con, ATTR)
    # the wait that follows 10 us later, after the step, ended by thread 12
    con.execute(
        "INSERT INTO offcpu (pid, tid, start_ns, end_ns, preempted, cpu, wakeup_ns, waker_pid, "
        "waker_tid, waker_comm) VALUES (100, 11, ?, ?, false, 0, ?, 100, 12, 'holder')",
        [250 * MS + 5_000, 256 * MS, 256 * MS],
    )
    note(filler, con, "offcpu", f"start_ns > {250 * MS}")
    filler.cycle(now_ns=253 * MS)  # still open: the last row may be followed within 50 us
    assert con.execute("SELECT max(step_idx) FROM step_components").fetchone()[0] == 6
    assert filler.steps_reset == 0  # that row was not late
    # a later wait, far enough from the last to close the chain
    con.execute(
        "INSERT INTO offcpu (pid, tid, start_ns, end_ns, preempted, cpu, wakeup_ns, waker_irq) "
        "VALUES (100, 11, ?, ?, false, 0, ?, true)",
        [300 * MS, 301 * MS, 301 * MS],
    )
    filler.cycle(now_ns=253 * MS)
    assert con.execute("SELECT max(step_idx) FROM step_components").fetchone()[0] == 7
    assert rows(con, ATTR) == recomputed(con, ATTR)
    lock = con.execute("SELECT lock_ns, waker_tid FROM step_attribution WHERE step_idx = 7")
    assert lock.fetchone() == (9 * MS - 5_000, 12)


def test_other_parameters_ignore_the_table():
    con = fixture_db("kernel")
    StepFiller(FakeStore(con), settle_ns=0).cycle(now_ns=FAR)
    con.execute("SET VARIABLE step_lock_chain_gap_ns = 1")
    # k11's timed-out wait no longer chains to the wake-up 10 us later
    assert con.execute("SELECT count(*) FROM _step_frontier").fetchone()[0] == 0
    assert rows(con, ATTR) == recomputed(con, ATTR)
    con.execute("RESET VARIABLE step_lock_chain_gap_ns")
    assert con.execute("SELECT count(*) FROM _step_frontier").fetchone()[0] == 2


@pytest.mark.parametrize("fixture", ["kernel", "engines"])
def test_backlog_filled_slice_by_slice(fixture, monkeypatch):
    # slices of 50 ms of run time: many cycles, each seeing part of the rows
    monkeypatch.setattr(step_fill, "BACKLOG_SLICE_NS", 50 * MS)
    con = fixture_db(fixture)
    expected = recomputed(con, ALL_STEP_VIEWS)
    filler = StepFiller(FakeStore(con), settle_ns=0)
    cycles = 0
    while True:
        filler.cycle(now_ns=FAR)
        cycles += 1
        if not filler.backlog or cycles > 500:
            break
    assert cycles > 5
    assert filled(con) == con.execute("SELECT count(*) FROM _step").fetchone()[0]
    assert rows(con, ALL_STEP_VIEWS) == expected


@pytest.mark.parametrize(
    ("cpu_share", "cycle_cpu_s", "expected"),
    [
        (0.001, 0.25, [60.0, 250.0, 250.0, 250.0]),  # paced: 0.25 s of CPU a cycle / 0.1 %
        (0.001, 0.01, [60.0, 60.0, 60.0, 60.0]),  # a cheap cycle: never sooner than the interval
        (0.001, 2.0, [60.0, 600.0, 600.0, 600.0]),  # never later than MAX_PACED_WAIT_S
        (1.0, 0.25, [60.0, 60.0, 60.0, 60.0]),  # share 1: every interval
    ],
)
def test_cycles_are_spaced_by_what_they_cost(monkeypatch, cpu_share, cycle_cpu_s, expected):
    """The thread's waits between cycles: the interval until a cycle filled
    something, then that cycle's CPU over cpu_share (bounded); a cycle that
    fills nothing (an idle engine) keeps the last figure."""
    con = fixture_db("kernel")
    filler = StepFiller(FakeStore(con), interval_s=60.0, settle_ns=0, cpu_share=cpu_share)
    clock = iter(range(1000))
    monkeypatch.setattr(step_fill.time, "thread_time", lambda: next(clock) * cycle_cpu_s)
    fills = iter([3, 0, 5])  # steps each cycle fills: the second finds nothing new
    monkeypatch.setattr(filler, "cycle", lambda: next(fills))
    waits = []
    monkeypatch.setattr(filler._stop, "wait", lambda s: waits.append(s) or len(waits) > 3)
    # its own thread: _run lowers the calling thread's priority
    t = threading.Thread(target=filler._run)
    t.start()
    t.join(10)
    assert waits == expected
    assert filler.last_cycle_cpu_s == pytest.approx(cycle_cpu_s)
