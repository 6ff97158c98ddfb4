"""Rule 1: the probe must not cause what it measures.

The seed's hook made one reference cycle per submission (a closure on each
ticket that referenced the ticket). These tests instrument the toy engine
(stallscope.demo.engine.ToyEngine, shaped like the seed's) with `attach()` and prove, with automatic GC disabled, that
completed submissions die by reference counting, that nothing unreachable is
left behind, and that the probe adds no GC-tracked objects per step. They run
with no daemon listening (the hot path is the same: records are dropped after
being written) and with a live one, on the C record write (where it is
built) and on the Python one.
"""

import gc
import inspect
import threading
import time
import weakref

import pytest

import probe_client
from helpers.waiting import wait_for
from stallscope.demo import engine as engine_model
from stallscope.demo.engine import Ticket

pytestmark = pytest.mark.daemon


class Executor(engine_model.Executor):
    """The toy engine's executor, keeping a weak reference to every ticket."""

    def __init__(self):
        super().__init__(engine_model.NoWork())
        self.made = []

    def submit(self, batch):
        ticket = super().submit(batch)
        self.made.append(weakref.ref(ticket))
        return ticket


def Engine():
    return engine_model.ToyEngine(Executor())


def instrument(probe, engine):
    probe.attach(engine, "_step", kind="step")
    probe.attach(
        engine, "_schedule", kind="schedule", stage="result.phase", batch="len(result.requests)"
    )
    probe.attach(engine, "executor.submit", kind="submit")
    probe.attach(Ticket, "collect", kind="collect")


@pytest.fixture(scope="module")
def live_daemon(tmp_path_factory):
    """One daemon for the module's live-daemon cases: each probe is a run of
    its own, and these tests look only at the client process (what it
    allocates, frees and keeps), never at what the daemon stored."""
    from helpers.daemonproc import DaemonProcess

    d = DaemonProcess(tmp_path_factory.mktemp("gc-rules")).start()
    yield d
    assert d.stop()[0] == 0


def _flushers():
    return [t for t in threading.enumerate() if t.name == "stallscope-flush"]


@pytest.fixture(
    params=["no-daemon", "live-daemon", "no-daemon/python-write", "live-daemon/python-write"]
)
def probe(request, tmp_path, monkeypatch):
    # Both record writes (the C one where it is built, and the Python one)
    # keep every rule here.
    if request.param.endswith("/python-write"):
        monkeypatch.setenv("STALLSCOPE_PROBE_ACCEL", "python")
    if request.param.startswith("no-daemon"):
        p = probe_client.connect(socket_path=str(tmp_path / "absent.sock"), gc=False)
    else:
        p = probe_client.connect(
            socket_path=request.getfixturevalue("live_daemon").socket, gc=False
        )
        assert p.connected
        # The flusher's thread-state report makes its (few, lasting) objects
        # once, right after connect: done before any window counts objects
        # per step.
        assert wait_for(lambda: p.stats()["pythreads_status"] is not None, 10)
    yield p
    p.close()


@pytest.fixture(autouse=True)
def no_flusher_left():
    # The counts these tests compare are process-wide: a closed probe's
    # flusher thread ends at its next wake (<= 100 ms) and frees its objects
    # then, which must not fall into the next test's window.
    yield
    assert wait_for(lambda: not _flushers(), 5), _flushers()


def test_completed_submission_released_without_cyclic_gc(probe, gc_off):
    engine = Engine()
    instrument(probe, engine)
    assert engine._step() == 3
    assert engine._step() == 3
    assert [r() for r in engine.executor.made] == [None, None]
    probe.close()
    assert Ticket.collect.__name__ == "collect" and not hasattr(Ticket.collect, "__wrapped__")


def test_no_more_unreachable_objects_than_without_probe(probe, gc_off):
    def unreachable_after(engine, n):
        gc.collect()
        for _ in range(n):
            engine._step()
        return gc.collect()

    baseline = unreachable_after(Engine(), 2000)
    engine = Engine()
    instrument(probe, engine)
    with_probe = unreachable_after(engine, 2000)
    assert with_probe <= baseline
    assert probe.errors == 0


def test_probe_adds_zero_net_tracked_objects_per_step(probe, gc_off):
    def count_delta(engine, n):
        for _ in range(50):
            engine._step()
        before = gc.get_count()[0]
        for _ in range(n):
            engine._step()
        return gc.get_count()[0] - before

    plain = count_delta(Engine(), 3000)
    engine = Engine()
    instrument(probe, engine)
    traced = count_delta(engine, 3000)
    assert traced == plain
    assert probe.stats()["next_seq"] >= 4 * 3000


def test_thread_state_listing_keeps_every_rule(tmp_path, gc_off, monkeypatch):
    """The CPU sampler's thread-state report (probe_client/_pythreads.py),
    made every 20 ms here (50 times its default rate) by the flusher while
    the engine steps: still zero net tracked objects per step (the count is
    process-wide, so a listing in progress at a window's edge shows; the
    measurement is retried) and no cyclic garbage."""
    from helpers.daemonproc import DaemonProcess

    monkeypatch.setenv("STALLSCOPE_PYTHREADS_INTERVAL_MS", "20")
    d = DaemonProcess(tmp_path).start()
    p = probe_client.connect(socket_path=d.socket, gc=False)
    try:
        deadline = time.monotonic() + 10
        while p.stats()["pythreads_sent"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.stats()["pythreads_status"] == "ok"

        def count_delta(engine, n):
            for _ in range(50):
                engine._step()
            before = gc.get_count()[0]
            for _ in range(n):
                engine._step()
            return gc.get_count()[0] - before

        def unreachable_after(engine, n):
            gc.collect()
            for _ in range(n):
                engine._step()
            return gc.collect()

        plain = count_delta(Engine(), 3000)
        baseline = unreachable_after(Engine(), 2000)
        engine = Engine()
        instrument(p, engine)
        made = p._pyreporter.listings
        traced = []
        # at least 5 rounds and 5 listings made meanwhile: the flusher's
        # ticks are counted, not timed (on a loaded machine it waits for the
        # GIL and a CPU, so a rate would be the machine's, not the client's)
        deadline = time.monotonic() + 30
        while len(traced) < 5 or p._pyreporter.listings - made < 5:
            assert time.monotonic() < deadline, (traced, p._pyreporter.listings - made)
            traced.append(count_delta(engine, 3000))
        assert plain in traced, (plain, traced)
        assert unreachable_after(engine, 2000) <= baseline
        assert p.errors == 0 and p.stats()["pythreads_errors"] == 0
    finally:
        p.close()
        d.stop()


def test_thread_state_report_leaves_no_cyclic_garbage(gc_off):
    """The report's one-time set-up (layout checks, a parked thread, the
    frames of every thread compared) and its listings leave nothing for the
    engine's collector (it once kept its own frame in a dict of frames)."""
    from probe_client import _pythreads

    gc.collect()
    rep = _pythreads.Reporter()
    assert rep.ok, rep.intro.status
    assert gc.collect() == 0
    for _ in range(100):
        rep.listing(lambda n: bytes(32))
    assert gc.collect() == 0


def test_gc_callback_retains_nothing(tmp_path, gc_off):
    p = probe_client.connect(socket_path=str(tmp_path / "absent.sock"), gc=True)
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(200):
        gc.collect(0)
    after = len(gc.get_objects())
    p.close()
    assert after - before <= 2  # list of objects itself, nothing per collection


def test_exceptions_from_the_wrapped_call_pass_through_and_are_timed(tmp_path):
    from helpers.daemonproc import DaemonProcess

    d = DaemonProcess(tmp_path).start()
    p = probe_client.connect(socket_path=d.socket, gc=False)

    class Flaky:
        def submit(self, batch):
            raise ValueError("engine error")

    flaky = Flaky()
    p.attach(flaky, "submit", kind="submit", batch="len(arg0)")
    with pytest.raises(ValueError, match="engine error"):
        flaky.submit([1, 2])
    p.close()
    d.stop()
    assert d.query("SELECT kind, batch FROM spans") == [("submit", 2)]


def test_attach_rejects_bad_specs_at_setup():
    p = probe_client.connect(socket_path="/nonexistent/x.sock", gc=False)
    engine = Engine()
    with pytest.raises(ValueError):
        p.attach(engine, "_schedule", kind="schedule", stage="result.phase()")
    with pytest.raises(ValueError):
        p.attach(engine, "_schedule", kind="schedule", batch="arg3.size")
    with pytest.raises(AttributeError):
        p.attach(engine, "executor.nope", kind="x")
    p.close()


def _drive(value):
    """Run a coroutine that never suspends, without an event loop."""
    if inspect.iscoroutine(value):
        try:
            value.send(None)
        except StopIteration as stop:
            return stop.value
        raise AssertionError("suspended")
    return value


class _Shapes:
    """One method of each shape, called every way that binds (no suspension
    in the async one, so it is driven without an event loop)."""

    def pos(self, bp, bootstrapping):
        return bp

    def defaults(self, a, b=[], c=None):  # noqa: B006 (the shape under test)
        return b

    def kwonly(self, a, *, k, j={}):  # noqa: B006
        return j

    def posonly(self, a, b=(), /, c=0):
        return c

    def varargs(self, a, *args, **kw):
        return a

    @staticmethod
    def static(a, b=None):
        return a

    @classmethod
    def klass(cls, a, *, k=1):
        return k

    async def coro(self, a, b=None, *, k=0):
        return a


_SHAPE_CALLS = [
    ("pos", (1,), {"bootstrapping": True}),
    ("pos", (), {"bp": 1, "bootstrapping": 2}),
    ("defaults", (1,), {}),
    ("defaults", (1,), {"c": 2}),
    ("kwonly", (1,), {"k": 2}),
    ("posonly", (1,), {"c": 2}),
    ("varargs", (1, 2), {"x": 3}),
    ("static", (1,), {"b": 2}),
    ("klass", (1,), {"k": 2}),
    ("coro", (1,), {"k": 2}),
]


@pytest.mark.parametrize("name, args, kwargs", _SHAPE_CALLS)
def test_every_shape_adds_zero_net_tracked_objects(probe, gc_off, name, args, kwargs):
    def count_delta(obj, n):
        method = getattr(obj, name)
        for _ in range(50):
            _drive(method(*args, **kwargs))
        before = gc.get_count()[0]
        for _ in range(n):
            _drive(method(*args, **kwargs))
        return gc.get_count()[0] - before

    plain_cls = type("Plain", (_Shapes,), {})
    traced_cls = type("Traced", (_Shapes,), {})
    plain = count_delta(plain_cls(), 3000)
    probe.attach(traced_cls, name, kind="shape", batch="arg0")
    # The count is process-wide: a previous test's flusher thread ending in
    # the window frees objects (a negative delta no wrapper can cause), so a
    # measurement is retried; an allocation per call would show every time.
    traced = [count_delta(traced_cls(), 3000) for _ in range(3)]
    assert plain in traced, (plain, traced)
    gc.collect()
    obj = traced_cls()
    ref = weakref.ref(obj)
    probe.attach(obj, name, kind="instance")
    for _ in range(100):
        _drive(getattr(obj, name)(*args, **kwargs))
    del obj
    assert ref() is None  # died by reference counting: no cycle through the wrapper
    assert probe.errors == 0
    assert probe.stats()["next_seq"] >= 3 * 3000 + 100
