"""The probe's two record writes: the optional C one (`probe_client/_accel.c`) and
the standard-library one write the same bytes, the C one declines to the
Python path whenever it is unsure, the client works without the C module
(as `stallscope run` injects it into any interpreter), and which write a run
used reaches the daemon's `runs.probe_accel`.

Tests that need the built module skip with the reason when it is absent;
`STALLSCOPE_REQUIRE_ACCEL=1` (CI, where a compiler is present) turns that
skip into a failure.
"""

import itertools
import os
import struct
import subprocess
import sys
import textwrap
import threading

import pytest

import probe_client
from helpers.run import stallscope_run, write_script
from probe_client import _probe, wire
from stallscope.demo import engine as engine_model

pytestmark = pytest.mark.daemon

STEP_SPEC = "toyengine:Engine.step=step,batch=len(arg0)"


def require_accel():
    if _probe._accel is None:
        if os.environ.get("STALLSCOPE_REQUIRE_ACCEL") == "1":
            pytest.fail("probe_client._accel is not built (STALLSCOPE_REQUIRE_ACCEL=1)")
        pytest.skip("probe_client._accel is not built (no compiler at install)")


def offline_probe(tmp_path, mode, monkeypatch):
    monkeypatch.setenv(_probe.ACCEL_ENV, mode)
    p = probe_client.connect(socket_path=str(tmp_path / f"absent-{mode}.sock"), gc=False)
    assert p.accelerator == ("python" if mode == "python" else "c")
    # Nothing is sent (and so dropped) while a test reads the buffer: no
    # flush is ever due, no reconnect is tried.
    p._last_send_ns = p._next_connect_ns = 1 << 62
    return p


@pytest.fixture
def pair(tmp_path, monkeypatch):
    """An offline probe on each write (records are written, then dropped at a flush)."""
    require_accel()
    c = offline_probe(tmp_path, "c", monkeypatch)
    py = offline_probe(tmp_path, "python", monkeypatch)
    yield c, py
    c.close()
    py.close()


def written(p):
    return bytes(p._buf[wire.HEADER_SIZE : p._pos])


def writer(p, kid):
    return p._accel.Writer(
        vars(p),
        p._buf,
        p._lock.locked,
        p._local,
        p._thread_state,
        kid,
        _probe.FULL_AT,
        _probe.MOSTLY_FULL_AT,
        _probe.FLUSH_INTERVAL_NS,
    )


STATES = [
    # depth, stage_id, batch, work, idle
    (0, 0, 0, None, None),
    (1, 3, 17, None, None),
    (2, 0xFFFF, 0xFFFFFFFF, None, None),
    (255, 1, 1, None, None),
    (0, 2, 5, 12345, None),
    (1, 2, 5, -(1 << 63), True),
    (0, 0, 0, (1 << 63) - 1, False),
    (3, 9, 0, None, True),
    (0, 4, 64, 0, False),
]


def test_c_and_python_writes_are_byte_identical(pair):
    c, py = pair
    kid = c._intern("step")
    assert py._intern("step") == kid
    rec = writer(c, kid).rec
    t = 1_000_000_000_000
    for depth, stage_id, batch, work, idle in STATES:
        for p in (c, py):
            st = p._thread_state()
            st.depth, st.stage_id, st.batch = depth, stage_id, batch
            if work is not None or idle is not None:
                st.ext, st.work, st.idle = 1, work, idle
        st_c, st_py = c._local.st, py._local.st
        assert type(st_c) is not type(st_py)  # the C state object against the Python one
        st_c.tid = st_py.tid = 0xFEDCBA98
        t += 1001
        answer = rec(st_c, t, t + 777)
        py._write_span(st_py, kid, t, t + 777)
        assert answer in (0, 1)
        assert written(c) == written(py)
        assert (c._pos, c._seqless) == (py._pos, py._seqless)
        for field in ("depth", "stage_id", "batch", "ext", "work", "idle"):
            assert getattr(st_c, field) == getattr(st_py, field), field
    # The bytes are the wire layout, decoded field by field.
    first = struct.unpack_from("<BBHIQQII", written(c), 0)
    assert first == (wire.REC_SPAN, 0, kid, 0xFEDCBA98, t0_of_first(), t0_of_first() + 777, 0, 0)
    ext = [r for r in struct.iter_unpack("<BBHIqQII", written(c)) if r[0] == wire.REC_SPAN_EXT]
    assert [(r[1], r[4]) for r in ext] == [
        (wire.EXT_HAS_WORK, 12345),
        (wire.EXT_HAS_WORK | wire.EXT_HAS_IDLE | wire.EXT_IDLE, -(1 << 63)),
        (wire.EXT_HAS_WORK | wire.EXT_HAS_IDLE, (1 << 63) - 1),
        (wire.EXT_HAS_IDLE | wire.EXT_IDLE, 0),
        (wire.EXT_HAS_WORK | wire.EXT_HAS_IDLE, 0),
    ]
    assert c._seqless == 5 and c.errors == py.errors == 0


def t0_of_first():
    return 1_000_000_000_000 + 1001


class Clock:
    """A deterministic stand-in for the wrappers' clock (the Python path's reads)."""

    def __init__(self):
        self.next = itertools.count(10_000_000, 1000).__next__


def instrument(p, engine, ticket_class):
    p.attach(engine, "_step", kind="step", work="len(self.waiting)", idle="len(self.waiting) == 0")
    p.attach(
        engine, "_schedule", kind="schedule", stage="result.phase", batch="len(result.requests)"
    )
    p.attach(engine, "executor.submit", kind="submit")
    p.attach(ticket_class, "collect", kind="collect")


def engine_for(tag):
    ticket = type(f"Ticket{tag}", (engine_model.Ticket,), {"collect": engine_model.Ticket.collect})
    executor = type(f"Executor{tag}", (engine_model.Executor,), {"ticket_class": ticket})
    return engine_model.ToyEngine(executor(engine_model.NoWork())), ticket


def test_wrappers_write_the_same_records_on_both_paths(pair):
    """The toy engine traced through each path's wrappers: the same records
    but for the timestamps, which are ordered and nested on both."""
    c, py = pair
    records = {}
    for p in (c, py):
        engine, ticket = engine_for(p.accelerator)
        engine.waiting = [1, 2, 3]
        instrument(p, engine, ticket)
        for _ in range(40):
            engine._step()
        rows = list(struct.iter_unpack("<BBHIQQII", written(p)))
        assert len(rows) == 40 * 5  # four spans and the step's SPAN_EXT
        spans = [r for r in rows if r[0] == wire.REC_SPAN]
        for r in spans:
            assert r[4] <= r[5]  # start <= end
        for i in range(0, len(spans), 4):
            sched, submit, collect, step = spans[i : i + 4]
            assert step[4] <= sched[4] and max(sched[5], submit[5], collect[5]) <= step[5]
        records[p.accelerator] = [r[:4] + r[6:] if r[0] == wire.REC_SPAN else r for r in rows]
        assert p.errors == 0
    assert records["c"] == records["python"]
    assert records["c"][:5] == [
        (wire.REC_SPAN, 1, c._ids["schedule"], c._local.st.tid, c._ids["recurrent"], 3),
        (wire.REC_SPAN, 1, c._ids["submit"], c._local.st.tid, c._ids["recurrent"], 3),
        (wire.REC_SPAN, 1, c._ids["collect"], c._local.st.tid, c._ids["recurrent"], 3),
        (wire.REC_SPAN, 0, c._ids["step"], c._local.st.tid, c._ids["recurrent"], 3),
        (wire.REC_SPAN_EXT, wire.EXT_HAS_WORK | wire.EXT_HAS_IDLE, 0, 0, 3, 0, 0, 0),
    ]


def test_the_c_write_declines_what_it_is_unsure_of(pair):
    c, _ = pair
    kid = c._intern("step")
    rec = writer(c, kid).rec
    st = c._thread_state()
    before = (written(c), c._pos)
    c._lock.acquire()  # another thread inside a locked section
    try:
        assert rec(st, 10, 20) == 2
    finally:
        c._lock.release()
    st.depth = 256  # not a u8: the Python path raises and counts it
    assert rec(st, 10, 20) == 2
    st.depth = 0
    assert rec(st, -1, 20) == 2 and rec(st, 10, 1 << 64) == 2 and rec(st, 10.0, 20) == 2
    st.ext, st.work = 1, 1 << 63  # not an i64
    assert rec(st, 10, 20) == 2
    st.work, st.idle = None, "yes"  # not a bool
    assert rec(st, 10, 20) == 2
    st.ext, st.idle = 0, None
    assert (written(c), c._pos) == before
    c._pos = _probe.FULL_AT  # full: the Python path sends first
    assert rec(st, 10, 20) == 2
    c._pos = wire.HEADER_SIZE
    assert rec(st, 10, 20) in (0, 1) and c._pos == wire.HEADER_SIZE + wire.RECORD_SIZE


def test_a_wrapper_whose_write_was_declined_still_records_through_python(pair):
    """While another thread holds the buffer lock the C write declines and
    the wrapper's Python path waits for the lock and writes."""
    c, _ = pair
    engine, ticket = engine_for("held")
    instrument(c, engine, ticket)
    engine.waiting = []
    c._lock.acquire()
    done = threading.Event()
    t = threading.Thread(target=lambda: (engine._step(), done.set()))
    t.start()
    assert not done.wait(0.2)  # the Python path waits for the lock, as it always did
    c._lock.release()
    t.join(10)
    assert done.is_set() and c.errors == 0
    assert len(written(c)) == 5 * wire.RECORD_SIZE


def test_enter_and_leave_use_the_threads_own_state_and_the_python_clock(pair):
    c, _ = pair
    w = writer(c, c._intern("step"))
    a = _probe._monotonic_ns()
    t0 = w.enter()  # the thread's first span: makes its state, as Python would
    st = c._local.st
    assert st.depth == 1
    assert w.leave(t0) in (0, 1)
    b = _probe._monotonic_ns()
    assert st.depth == 0 and a <= t0 <= st.last_end_ns <= b
    (row,) = struct.iter_unpack("<BBHIQQII", written(c))
    assert row[3:6] == (st.tid, t0, st.last_end_ns)
    # Another thread gets its own state (the cache is per thread, never shared).
    other = []

    def run():
        t = w.enter()
        other.append(c._local.st)
        w.leave(t)

    th = threading.Thread(target=run)
    th.start()
    th.join()
    assert other[0] is not st and other[0].depth == 0 and other[0].tid == th.native_id
    t0 = w.enter()
    assert st.depth == 1 and w.leave(t0) in (0, 1) and st.depth == 0
    rows = list(struct.iter_unpack("<BBHIQQII", written(c)))
    assert [r[3] for r in rows] == [st.tid, th.native_id, st.tid]


def test_the_client_works_without_the_c_module(tmp_path):
    """As in an interpreter the module was not built for: stdlib only."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["probe_client._accel"] = None  # any import of it fails
        import probe_client
        p = probe_client.connect(socket_path=sys.argv[1], gc=False)
        class E:
            def step(self, n):
                return n
        e = E()
        p.attach(e, "step", kind="step", batch="arg0")
        for i in range(100):
            e.step(i)
        print(probe_client.ACCELERATOR, p.accelerator, p.stats()["next_seq"], p.errors)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "absent.sock")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.split() == ["python", "python", "100", "0"]


@pytest.mark.parametrize("mode", ["c", "python"])
def test_stallscope_run_reports_the_write_in_use(daemon, tmp_path, mode):
    if mode == "c":
        require_accel()
    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    from helpers.run import TOY_ENGINE

    (engine_dir / "toyengine.py").write_text(TOY_ENGINE)
    script = write_script(
        engine_dir,
        "app.py",
        """
        import toyengine
        engine = toyengine.Engine()
        for i in range(20):
            engine.step([0] * (i % 3 + 1), wait_s=0)
        """,
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env[_probe.ACCEL_ENV] = mode
    done = stallscope_run(
        ["--socket", daemon.socket, "--label", mode, "--attach", STEP_SPEC, "--", sys.executable]
        + [script],
        cwd=engine_dir,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    daemon.stop()
    # 20 steps, and a GC pass if the engine's allocations made one (the run's
    # client is started with gc on; whether a pass falls inside 20 steps
    # depends on what the process allocated before, e.g. its environment)
    passes = daemon.scalar("SELECT count(*) FROM gc_events")
    got = daemon.query("SELECT label, probe_accel, records FROM runs")
    assert got == [(mode, mode, 20 + passes)], (
        got,
        passes,
        daemon.query("SELECT kind_id, count(*) FROM spans GROUP BY ALL"),
        daemon.query("SELECT reason, sum(count) FROM ingest_errors GROUP BY ALL"),
        done.stderr[-2000:],
    )
    assert daemon.query("SELECT batch FROM spans ORDER BY seq") == [(i % 3 + 1,) for i in range(20)]


def test_a_full_buffer_in_a_forked_child_goes_through_python(tmp_path):
    """A long step of many inner spans fills the buffer: each write that
    finds it full is declined to the Python path, which sends (here: drops)
    and writes; in a forked child too, where the probe has a new
    threading.local but the wrappers keep theirs."""
    require_accel()
    code = textwrap.dedent(
        """
        import os, sys
        import probe_client
        p = probe_client.connect(socket_path=sys.argv[1], gc=False)
        class E:
            def inner(self):
                return 1
            def outer(self, n):
                return sum(self.inner() for _ in range(n))
        e = E()
        p.attach(E, "inner", kind="inner")
        p.attach(E, "outer", kind="outer")
        e.outer(10)
        pid = os.fork()
        if pid == 0:
            e.outer(2000)
            st = p.stats()
            print(p.accelerator, st["errors"], st["next_seq"], st["drops_disconnected"], flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "absent.sock")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    accel, errors, next_seq, dropped = out.stdout.split()
    assert (accel, errors, next_seq) == ("c", "0", "2001")
    assert int(dropped) >= 2001 - 511  # the full buffers were sent (dropped: no daemon)
