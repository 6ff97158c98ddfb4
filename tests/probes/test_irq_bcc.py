"""The IRQ-time probe on real softirqs: loopback traffic sent by a tracked thread."""

import json
import time

import numpy as np
import pytest

from helpers.privileged import require_privileged
from helpers.sched import CollectSink, Workload
from stallscope.probes.irq_bcc import SOFTIRQ_NAMES, BccIrqProbe

pytestmark = pytest.mark.privileged

NET_RX = SOFTIRQ_NAMES.index("NET_RX")


@pytest.fixture(scope="module")
def probe():
    reason = BccIrqProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    p = BccIrqProbe()
    p.sink = CollectSink()
    p.start(p.sink)
    yield p
    p.stop()


def test_loopback_receive_softirqs_are_the_senders(probe):
    """Datagrams sent on loopback are received in a NET_RX softirq on the
    sending CPU, with the sender current: a tracked sender gets those rows."""
    work = Workload()
    try:
        probe.track(work.pid)
        work.start_thread()
        work.call("pin 1")
        t0, t1, sent = json.loads(work.call("udp 2000"))
        probe.drain()
    finally:
        probe.untrack(work.pid)
        work.close()
    rows = probe.sink.table("irq_time", work.tid)
    assert len(rows.get("tid", [])), "no irq_time rows for the sending thread"
    inside = (rows["start_ns"] >= t0) & (rows["end_ns"] <= t1)
    rx = inside & (rows["kind"] == "softirq") & (rows["vec"] == NET_RX)
    assert int(rx.sum()) >= 10, (sent, list(zip(rows["kind"], rows["vec"], strict=True)))
    assert np.all(rows["cpu"][rx] == 1)
    assert np.all(rows["end_ns"] >= rows["start_ns"])
    assert np.all(rows["pid"] == work.pid)


def test_untracked_thread_gives_no_rows(probe):
    work = Workload()
    try:
        work.start_thread()
        work.call("udp 500")
        probe.drain()
        assert not len(probe.sink.table("irq_time", work.tid).get("tid", []))
    finally:
        work.close()


def test_busy_thread_gets_the_tick_softirqs(probe):
    """The timer tick interrupts a spinning thread; the softirqs it raises
    (TIMER, SCHED, RCU) run with that thread current."""
    work = Workload()
    try:
        probe.track(work.pid)
        work.start_thread()
        work.call("pin 1")
        t0 = time.monotonic_ns()
        work.call("spin 300")
        t1 = time.monotonic_ns()
        probe.drain()
    finally:
        probe.untrack(work.pid)
        work.close()
    rows = probe.sink.table("irq_time", work.tid)
    inside = (rows["start_ns"] >= t0) & (rows["end_ns"] <= t1) & (rows["kind"] == "softirq")
    tick = [SOFTIRQ_NAMES.index(n) for n in ("TIMER", "SCHED", "RCU")]
    # (the worker sleeps 0.5 ms every 4 ms, so some ticks find it off CPU)
    assert int((inside & np.isin(rows["vec"], tick)).sum()) >= 1, list(rows["vec"][inside])
    assert np.all(rows["vec"][rows["kind"] == "softirq"] < len(SOFTIRQ_NAMES))
