"""Rule 1: the probe must not cause what it measures.

The seed's hook made one reference cycle per submission (a closure on each
ticket that referenced the ticket). These tests instrument the toy engine
(stallscope.demo.engine.ToyEngine, shaped like the seed's) with `attach()` and prove, with automatic GC disabled, that
completed submissions die by reference counting, that nothing unreachable is
left behind, and that the probe adds no GC-tracked objects per step. They run
with no daemon listening (the hot path is the same: records are dropped after
being written) and with a live one.
"""

import gc
import weakref

import pytest

import probe_client
from stallscope.demo import engine as engine_model
from stallscope.demo.engine import Ticket


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


@pytest.fixture
def gc_off():
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if was:
        gc.enable()


@pytest.fixture(params=["no-daemon", "live-daemon"])
def probe(request, tmp_path):
    if request.param == "no-daemon":
        p = probe_client.connect(socket_path=str(tmp_path / "absent.sock"), gc=False)
        yield p
        p.close()
        return
    from helpers.daemonproc import DaemonProcess

    d = DaemonProcess(tmp_path).start()
    p = probe_client.connect(socket_path=d.socket, gc=False)
    assert p.connected
    yield p
    p.close()
    d.stop()


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
