"""The bcc sched probe against the kernel's own per-thread counters, on real scheduling."""

import json

import numpy as np
import pytest

from conftest import require_privileged
from sched_harness import (CollectSink, Workload, clipped_sum, in_window, spawn_hog,
                           window)
from stallscope.probes.sched_bcc import BccSchedProbe


@pytest.fixture(scope="module")
def probe():
    reason = BccSchedProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    sink = CollectSink()
    p = BccSchedProbe()
    p.start(sink)
    p.sink = sink
    yield p
    p.stop()


@pytest.fixture
def work(probe):
    w = Workload()
    probe.track(w.pid)
    w.start_thread()          # created after track(): must be followed
    yield w
    probe.untrack(w.pid)
    w.close()


def test_contended_thread_matches_proc(probe, work):
    work.call("pin 1")
    hog = spawn_hog(1)
    try:
        w = window(work, "spin 400", probe.drain)
    finally:
        hog.kill()
        hog.wait()
    off = probe.sink.table("offcpu", work.tid)
    started = in_window(off["start_ns"], w)
    preempted = int((off["preempted"] & started).sum())
    voluntary = int((~off["preempted"] & started).sum())
    assert w.delta("nonvoluntary") >= 10, "the hog did not preempt the worker"
    assert abs(preempted - w.delta("nonvoluntary")) <= 0.01 * w.delta("nonvoluntary")
    assert abs(voluntary - w.delta("voluntary")) <= max(1, 0.01 * w.delta("voluntary"))

    rq = probe.sink.table("runq", work.tid)
    ended = in_window(rq["end_ns"], w)
    wait_ns = int((rq["end_ns"][ended] - rq["start_ns"][ended]).sum())
    assert w.delta("wait_ns") > 0
    assert abs(wait_ns - w.delta("wait_ns")) <= 0.05 * w.delta("wait_ns")

    wall_ns = w.t1_ns - w.t0_ns
    on_plus_off = w.delta("run_ns") + clipped_sum(off["start_ns"], off["end_ns"], w)
    assert abs(on_plus_off - wall_ns) <= 0.01 * wall_ns
    assert np.all(off["end_ns"] >= off["start_ns"])
    assert np.all(rq["end_ns"] >= rq["start_ns"])
    assert not probe.sink.losses


def test_affinity_flips_are_migrations(probe, work):
    work.call("pin 0")
    n_flips = 20
    w = window(work, f"flip {n_flips}", probe.drain)
    mig = probe.sink.table("migrations", work.tid)
    sel = in_window(mig["ts_ns"], w)
    assert int(sel.sum()) == n_flips == w.delta("nr_migrations")
    assert np.all(mig["from_cpu"][sel] != mig["to_cpu"][sel])
    # pinned to 0 first, so the flips go 0->1, 1->0, ...
    assert list(mig["to_cpu"][sel]) == [(i + 1) % 2 for i in range(n_flips)]


def test_events_fall_inside_markers(probe, work):
    """Clock alignment: bpf_ktime_get_ns and time.monotonic_ns are one clock."""
    work.call("pin 0")
    w = window(work, "marks 20", probe.drain)
    marks = json.loads(w.reply)
    off = probe.sink.table("offcpu", work.tid)
    mig = probe.sink.table("migrations", work.tid)
    for kind, t0, t1 in marks:
        if kind == "sleep":
            inside = (off["start_ns"] >= t0) & (off["end_ns"] <= t1) & ~off["preempted"]
        else:
            inside = (mig["ts_ns"] >= t0) & (mig["ts_ns"] <= t1)
        assert inside.any(), f"no {kind} event inside its markers [{t0}, {t1}]"


def test_untracked_process_gives_no_rows(probe):
    w = Workload()
    try:
        w.start_thread()
        w.call("pin 0")
        window(w, "flip 4", probe.drain)
        assert not len(probe.sink.table("migrations", w.tid).get("tid", []))
        assert not len(probe.sink.table("offcpu", w.tid).get("tid", []))
        # and once tracked then untracked, nothing more arrives
        probe.track(w.pid)
        window(w, "flip 4", probe.drain)
        assert len(probe.sink.table("migrations", w.tid)["tid"]) == 4
        probe.untrack(w.pid)
        window(w, "flip 4", probe.drain)
        assert len(probe.sink.table("migrations", w.tid)["tid"]) == 4
    finally:
        w.close()


def test_status_reports_reader_work(probe):
    st = probe.status()
    assert st["backend"] == "bcc" and st["resolution_ns"] == 0
    assert st["records"] > 0 and st["drains"] > 0
