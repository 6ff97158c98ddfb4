"""The page-fault probe on real first-touch faults: count, interval, calibrated cost."""

import json

import numpy as np
import pytest

from helpers.privileged import require_privileged
from helpers.sched import CollectSink, Workload
from stallscope.probes.faults_bcc import BccFaultsProbe, first_touch_cost

pytestmark = pytest.mark.privileged


@pytest.fixture(scope="module")
def probe():
    reason = BccFaultsProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    p = BccFaultsProbe()
    p.sink = CollectSink()
    p.start(p.sink)
    yield p
    p.stop()


@pytest.fixture
def work(probe):
    w = Workload()
    probe.track(w.pid)
    w.start_thread()
    yield w
    probe.untrack(w.pid)
    w.close()


def test_first_touch_burst_lands_in_its_interval(probe, work):
    t0, t1, minflt = json.loads(work.call("touch 4096"))
    probe.drain(final=True)
    rows = probe.sink.table("page_faults", work.tid)
    assert len(rows["count"]), "no page_faults rows for the worker"
    # rows are [first fault, last fault] of up to 20 ms: the burst's rows
    # overlap [t0, t1] and may have taken in a few faults just before or after
    overlapping = (rows["start_ns"] <= t1) & (rows["end_ns"] >= t0)
    counted = int(rows["count"][overlapping].sum())
    assert minflt >= 4096
    # the kernel's own minor-fault count of the thread over the same calls
    assert abs(counted - minflt) <= 0.03 * minflt, (counted, minflt)
    assert np.all(rows["start_ns"][overlapping] >= t0 - probe.flush_ns)
    assert np.all(rows["end_ns"][overlapping] <= t1 + probe.flush_ns)
    assert np.all(rows["end_ns"] >= rows["start_ns"])
    # intervals are bounded by the flush period (20 ms) plus one fault
    assert np.all(rows["end_ns"] - rows["start_ns"] <= probe.flush_ns + 5_000_000)
    assert np.all(rows["cost_ns"] == rows["count"] * probe.cost_ns)


def test_calibration_recorded(probe):
    c = probe.calibration
    assert c["cost_ns_per_fault"] > 0
    # the program saw the calibration thread's faults as the kernel counted them
    assert abs(c["faults_counted"] - c["faults_kernel"]) <= 0.03 * c["faults_kernel"]
    assert "ns per fault" in probe.detail()
    assert probe.status()["calibration"]["cost_ns_per_fault"] == c["cost_ns_per_fault"]


def test_untracked_process_gives_no_rows(probe):
    w = Workload()
    try:
        w.start_thread()
        w.call("touch 512")
        probe.drain(final=True)
        assert not len(probe.sink.table("page_faults", w.tid).get("tid", []))
    finally:
        w.close()


def test_cost_measure_runs_unprivileged():
    cost, faults = first_touch_cost(256)
    assert faults >= 256 and cost > 0
