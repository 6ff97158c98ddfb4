"""The /proc sched probe: real scheduling (totals exact per window) and a fixture procfs."""

import numpy as np
import pytest

from helpers.sched import CollectSink, Workload, spawn_hog, window
from stallscope.probes.base import ProbeSettings
from stallscope.probes.sched_proc import ProcSchedProbe

POLL_HZ = 200.0


@pytest.fixture
def probe():
    sink = CollectSink()
    p = ProcSchedProbe(ProbeSettings(sched_poll_hz=POLL_HZ))
    assert ProcSchedProbe.unavailable(p.settings) is None
    p.start(sink)
    p.sink = sink
    yield p
    p.stop()


@pytest.fixture
def work(probe):
    w = Workload()
    probe.track(w.pid)
    w.start_thread()  # born after track(): found by the rescan
    yield w
    w.close()


def overlapping(rows, w):
    return (rows["end_ns"] > w.t0_ns) & (rows["start_ns"] < w.t1_ns)


def test_contended_thread_totals_match_proc(probe, work):
    work.call("pin 1")
    hog = spawn_hog(1)
    try:
        w = window(work, "spin 300", probe.drain, boundary=probe.drain)
    finally:
        hog.kill()
        hog.wait()
    off = probe.sink.table("offcpu", work.tid)
    sel = overlapping(off, w)
    assert w.delta("nonvoluntary") > 0
    assert int(off["preempted_events"][sel].sum()) == w.delta("nonvoluntary")
    assert int((off["events"] - off["preempted_events"])[sel].sum()) == w.delta("voluntary")
    # every row is a window of about one poll period, not an interval
    assert np.all(off["resolution_ns"] == off["end_ns"] - off["start_ns"])
    assert all(v is None for v in off["preempted"])

    rq = probe.sink.table("runq", work.tid)
    sel_rq = overlapping(rq, w)
    assert int(rq["wait_ns"][sel_rq].sum()) == w.delta("wait_ns")
    # on-CPU + off-CPU over the windows that cover the bracket == their length
    span_ns = int(off["end_ns"][sel].max() - off["start_ns"][sel].min())
    covered = off["start_ns"] >= off["start_ns"][sel].min()
    covered &= off["end_ns"] <= off["end_ns"][sel].max()
    assert int(off["offcpu_ns"][covered].sum()) <= span_ns
    assert w.delta("run_ns") > 0


def test_affinity_flips_counted(probe, work):
    work.call("pin 0")
    w = window(work, "flip 20", probe.drain, boundary=probe.drain)
    mig = probe.sink.table("migrations", work.tid)
    sel = (mig["ts_ns"] > w.t0_ns) & (mig["ts_ns"] - mig["resolution_ns"] < w.t1_ns)
    assert int(mig["events"][sel].sum()) == 20 == w.delta("nr_migrations")


def test_status_records_resolution(probe, work):
    probe.drain()
    st = probe.status()
    assert st["resolution_ns"] == int(1e9 / POLL_HZ)
    assert st["threads"] >= 2 and st["polls"] > 0


def _write_task(root, pid, tid, run_ns, wait_ns, slices, vol, invol, mig, cpu):
    d = root / str(pid) / "task" / str(tid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "schedstat").write_text(f"{run_ns} {wait_ns} {slices}\n")
    (d / "status").write_text(
        f"Name:\tx\nvoluntary_ctxt_switches:\t{vol}\nnonvoluntary_ctxt_switches:\t{invol}\n"
    )
    (d / "sched").write_text(f"x ({tid}, #threads: 1)\nse.nr_migrations  :  {mig}\n")
    fields = ["S"] + ["0"] * 35 + [str(cpu)] + ["0"] * 10
    (d / "stat").write_text(f"{tid} (a) b) " + " ".join(fields) + "\n")


def test_fixture_procfs(tmp_path):
    """proc_root is a setting: rows follow the fixture's counter changes exactly."""
    root = tmp_path
    _write_task(root, 100, 100, 1000, 50, 3, 10, 2, 1, 0)
    sink = CollectSink()
    p = ProcSchedProbe(ProbeSettings(proc_root=str(root), sched_poll_hz=1.0))
    p._sink = sink  # no timer thread: drain() by hand
    p.track(100)
    assert p.drain() == 0  # nothing changed yet
    # in-place rewrites keep the kept-open descriptors valid
    _write_task(root, 100, 100, 3000, 80, 5, 13, 6, 4, 1)
    _write_task(root, 100, 101, 0, 0, 0, 0, 0, 0, 1)  # a new thread
    assert p.drain() == 3
    off = sink.table("offcpu")
    assert list(off["events"]) == [7] and list(off["preempted_events"]) == [4]
    assert list(sink.table("runq")["wait_ns"]) == [30]
    mig = sink.table("migrations")
    assert list(mig["events"]) == [3]
    assert list(mig["from_cpu"]) == [0] and list(mig["to_cpu"]) == [1]
    assert p.status()["threads"] == 2
    # the new thread is followed from its first sample on
    _write_task(root, 100, 101, 10, 5, 1, 1, 0, 0, 1)
    assert p.drain() == 2
    assert list(sink.table("runq", 101)["wait_ns"]) == [5]
    # a thread that disappears is dropped, not an error
    for name in ("schedstat", "status", "sched", "stat"):
        (root / "100" / "task" / "101" / name).write_text("")
    p.drain()
    assert p.status()["threads"] == 1
    p.stop()


def test_unavailable_names_the_fix(tmp_path):
    reason = ProcSchedProbe.unavailable(ProbeSettings(proc_root=str(tmp_path)))
    assert reason and str(tmp_path) in reason
