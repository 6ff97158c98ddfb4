"""The page-fault probe on real fault bursts of three kinds: count, interval, and
the fault time measured in the faulting thread against the thread's own truth."""

import json
import os

import numpy as np
import pytest

from helpers import fault_kinds
from helpers.privileged import require_privileged
from helpers.sched import CollectSink, Workload, spawn_hog
from helpers.waiting import wait_for
from stallscope.probes.faults_bcc import COST_METHODS, BccFaultsProbe, first_touch_cost

pytestmark = pytest.mark.privileged

# bytes per burst: 4,096 faults of 4 KiB pages, 24 of 2 MiB huge pages
SIZES = {"anon": 16 << 20, "huge": 48 << 20, "file": 16 << 20}
# The measured time must be within this of the truth (issue 24). What it
# adds to a fault is the user-mode work up to the next fault: here one
# strided byte write (a few ns against a fault's ~2-400 us), and the
# interval's last fault priced at the mean of the others.
TOLERANCE = 0.25


@pytest.fixture(scope="module")
def probe():
    reason = BccFaultsProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    p = BccFaultsProbe()
    p.sink = CollectSink()
    p.start(p.sink)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    return fault_kinds.cached_file(
        str(tmp_path_factory.mktemp("faults") / "cached.bin"), SIZES["file"]
    )


@pytest.fixture
def work(probe):
    w = Workload()
    probe.track(w.pid)
    w.start_thread()
    yield w
    probe.untrack(w.pid)
    w.close()


def _burst_rows(probe, work, rec):
    """The probe's rows for the worker that overlap the burst."""
    probe.drain(final=True)
    rows = probe.sink.table("page_faults", work.tid)
    assert len(rows.get("count", [])), "no page_faults rows for the worker"
    sel = (rows["start_ns"] <= rec["t1"]) & (rows["end_ns"] >= rec["t0"])
    return {k: v[sel] for k, v in rows.items()}, rows


@pytest.mark.parametrize("kind", fault_kinds.KINDS)
def test_each_kind_is_counted_and_its_time_measured(probe, work, cached, kind):
    rec = json.loads(work.call(f"touch {kind} {SIZES[kind]} {cached}"))
    rows, every = _burst_rows(probe, work, rec)
    counted = int(rows["count"].sum())
    # the kernel's own minor-fault count of the thread over the touch (a few
    # more faults of the interpreter may share the burst's rows)
    assert rec["faults"] >= (24 if kind == "huge" else 4096), rec
    # None missed: at most 3 (3 %) fewer. More: the burst's first and last
    # rows also hold the interpreter's own faults of up to a flush period
    # either side (31 counted against 27 huge-page faults in one CI run).
    assert counted >= rec["faults"] - max(3, 0.03 * rec["faults"]), (counted, rec)
    assert counted - rec["faults"] <= max(8, 0.03 * rec["faults"]), (counted, rec)
    # rows are [first fault, last fault] of up to 20 ms, plus one fault
    assert np.all(every["end_ns"] >= every["start_ns"])
    assert np.all(every["end_ns"] - every["start_ns"] <= probe.flush_ns + 5_000_000)
    # in a burst every fault but an interval's last is followed by the next
    # one within the gap bound (5 ms of CPU; a huge-page fault takes 0.25-3
    # ms here, a 4 KiB one 2-5 us): measured in the thread
    measured = int(rows["measured"].sum())
    assert measured >= counted - len(rows["count"]) - 1, (measured, counted, rec)
    cost = int(sum(rows["cost_ns"]))
    print(f"{kind}: {counted} faults, measured {cost / 1e6:.3f} ms, truth "
          f"{rec['truth_ns'] / 1e6:.3f} ms ({cost / rec['truth_ns']:.3f})")  # fmt: skip
    assert abs(cost - rec["truth_ns"]) <= TOLERANCE * rec["truth_ns"], (cost, rec)
    # an interval's last fault is costed by its row's mean, or by the thread's
    # when its row has no measured fault (a huge-page burst has only ~30)
    assert set(rows["cost_method"]) <= {"measured", "row_mean", "thread_mean"}, set(
        rows["cost_method"]
    )
    assert set(every["cost_method"]) <= set(COST_METHODS)


def test_a_sparse_fault_does_not_take_the_work_after_it(probe, work):
    # 40 faults, each followed by 2 ms of user-mode work before the next: the
    # next fault is within the 5 ms gap bound, so timed to it each fault would
    # take its 2 ms of work (80 ms). Timed to its page's mapping (+ at most
    # 5 us back to user mode) each is a few us (p99 of a 4 KiB fault ~15-45
    # us on a loaded VM).
    rec = json.loads(work.call("sparse 40 2000"))
    rows, _ = _burst_rows(probe, work, rec)
    counted = int(rows["count"].sum())
    assert counted >= 40, (counted, rec)
    measured = int(rows["measured"].sum())
    assert measured >= counted - 2, (measured, counted)  # each fault mapped a page
    cost = int(sum(rows["cost_ns"]))
    per_fault = cost / counted
    print(f"sparse: {counted} faults, {cost / 1e3:.0f} us in all ({per_fault / 1e3:.1f} us each) "
          f"against {rec['spin_ns'] / 1e6:.1f} ms of work")  # fmt: skip
    assert 0 < per_fault <= 50_000, (per_fault, rows)
    assert probe.status()["measured_faults_ended_at"]["mapping"] >= 40


def test_without_the_mapping_end_faults_are_timed_to_the_next_one():
    # A kernel that refuses the mapping end (no BTF task pointer) gets the
    # next-fault measure alone: a burst is still measured, the method says so.
    reason = BccFaultsProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    p = BccFaultsProbe()
    p.map_end = False
    p.sink = CollectSink()
    p.start(p.sink)
    w = Workload()
    try:
        p.track(w.pid)
        w.start_thread()
        rec = json.loads(w.call(f"touch anon {SIZES['anon']}"))
        rows, _ = _burst_rows(p, w, rec)
        assert p.method == "oncpu_to_next_fault" and "oncpu_to_next_fault" in p.detail()
        assert p.status()["measured_faults_ended_at"]["mapping"] == 0
        cost = int(sum(rows["cost_ns"]))
        assert abs(cost - rec["truth_ns"]) <= TOLERANCE * rec["truth_ns"], (cost, rec)
    finally:
        p.untrack(w.pid)
        w.close()
        p.stop()


def _cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        utime, stime = f.read().rsplit(")", 1)[1].split()[11:13]
    return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


def test_the_clock_stops_while_the_thread_is_preempted(probe, work):
    # The worker and a CPU-bound hog share one CPU at the same weight: the
    # fair scheduler runs each about half the time, in turns of a few ms, so
    # a burst of ~10 ms of CPU takes ~20 ms of wall time (at least 1.3 x is
    # asserted: a turn of slack). A clock that ran off CPU would measure the
    # wall time, beyond the 25 % tolerance; the measured time must follow the
    # thread's CPU time.
    work.call("pin 1")
    hog = spawn_hog(1)
    try:
        assert wait_for(lambda: _cpu_s(hog.pid) >= 0.1, 10)  # spinning, past its start-up
        rec = json.loads(work.call(f"touch anon {SIZES['anon']}"))
    finally:
        hog.kill()
        hog.wait()
    assert rec["preempted"] > 0, rec  # the hog took turns during the burst
    wall = rec["t1"] - rec["t0"]
    assert wall >= 1.3 * rec["first_cpu_ns"], rec
    rows, _ = _burst_rows(probe, work, rec)
    cost = int(sum(rows["cost_ns"]))
    print(f"preempted {rec['preempted']} times: wall {wall / 1e6:.3f} ms, cost {cost / 1e6:.3f} "
          f"ms, truth {rec['truth_ns'] / 1e6:.3f} ms")  # fmt: skip
    assert abs(cost - rec["truth_ns"]) <= TOLERANCE * rec["truth_ns"], (cost, wall, rec)


def test_calibration_recorded(probe):
    c = probe.calibration
    assert c["cost_ns_per_fault"] > 0
    # the program saw the calibration thread's faults as the kernel counted them
    assert abs(c["faults_counted"] - c["faults_kernel"]) <= 0.03 * c["faults_kernel"]
    assert "ns per fault" in probe.detail() and "oncpu_to_mapping" in probe.detail()
    assert probe.status()["calibration"]["cost_ns_per_fault"] == c["cost_ns_per_fault"]
    assert probe.status()["method"] == "oncpu_to_mapping"


def test_untracked_process_gives_no_rows(probe):
    w = Workload()
    try:
        w.start_thread()
        w.call(f"touch anon {2 << 20}")
        probe.drain(final=True)
        assert not len(probe.sink.table("page_faults", w.tid).get("tid", []))
    finally:
        w.close()


def test_cost_measure_runs_unprivileged():
    cost, faults = first_touch_cost(256)
    assert faults >= 256 and cost > 0
