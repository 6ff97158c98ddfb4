"""The CUDA driver probe on a fake libcuda: every variant counted, per traced process only.

The fake driver (tests/cuda/fake_libcuda.c) is built here with cc under
the real driver's file name and driven by tests/cuda/cuda_engine.py; the
probe finds it in the engine's /proc/PID/maps and attaches real uprobes to
it exactly as it would to NVIDIA's library.
"""

import errno
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import fakecuda
from helpers.privileged import require_privileged
from helpers.sched import CollectSink
from helpers.waiting import wait_for
from stallscope.probes import cuda_bcc
from stallscope.probes.cuda_bcc import BccCudaProbe, entry_points, exported_functions

pytestmark = pytest.mark.privileged

ENGINE = Path(__file__).resolve().parents[1] / "cuda" / "cuda_engine.py"


class Engine:
    """tests/cuda/cuda_engine.py serve: one command per line."""

    def __init__(self, lib):
        self.proc = subprocess.Popen(
            [sys.executable, str(ENGINE), "serve", str(lib)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ids = json.loads(self.proc.stdout.readline())
        self.pid, self.tid = ids["pid"], ids["tid"]

    def call(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    fakecuda.require_cc()
    return fakecuda.build(tmp_path_factory.mktemp("fakecuda"))


@pytest.fixture(scope="module")
def probe():
    reason = BccCudaProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    p = BccCudaProbe()
    p.sink = CollectSink()
    p.start(p.sink)
    yield p
    p.stop()


@pytest.fixture
def engine(probe, lib):
    e = Engine(lib)
    probe.track(e.pid)
    yield e
    probe.untrack(e.pid)
    e.close()


def attached(probe, pid):
    return probe.status()["processes"].get(str(pid), {}).get("attached")


def rows_of(probe, pid, t0=0, t1=2**63 - 1):
    probe.drain(final=True)
    rows = probe.sink.table("cuda_calls")
    if not rows:
        return {}
    sel = (rows["pid"] == pid) & (rows["start_ns"] >= t0) & (rows["end_ns"] <= t1)
    return {k: v[sel] for k, v in rows.items()}


def test_the_fake_exports_every_probed_variant(lib):
    points = entry_points(exported_functions(lib))
    wanted = fakecuda.LAUNCHES + fakecuda.SYNCS + fakecuda.QUERIES + fakecuda.COPIES
    assert set(points) == set(wanted)
    assert "cuCtxGetCurrent" not in points and "cuGetProcAddress" not in points


def test_untracked_and_detached_calls_are_not_seen(probe, engine, lib):
    other = Engine(lib)  # never tracked: it maps the driver too
    try:
        engine.call("load")
        other.call("load")
        assert wait_for(lambda: probe.status()["processes"].get(str(engine.pid)))
        t0, t1 = engine.call("launch 100")  # detached: nothing recorded
        assert not len(rows_of(probe, engine.pid, t0, t1).get("pid", []))
        probe.attach()
        try:
            assert attached(probe, engine.pid) == len(
                fakecuda.LAUNCHES + fakecuda.SYNCS + fakecuda.QUERIES + fakecuda.COPIES
            )
            other.call("launch 500")
            other.call("sync 2000000 spin")
            # every uprobe the probe holds (as the kernel says) is on the
            # traced pid, an entry and a return per entry point: the other
            # process's calls never trap
            assert probe.held_uprobes() == {engine.pid: 2 * attached(probe, engine.pid)}
        finally:
            probe.detach()
        assert str(other.pid) not in probe.status()["processes"]
        assert not len(rows_of(probe, other.pid).get("pid", []))
    finally:
        other.close()


@pytest.mark.parametrize("name", fakecuda.LAUNCHES)
def test_launches_of_every_variant_are_counted_exactly(probe, engine, name):
    engine.call("load")
    assert wait_for(lambda: probe.status()["processes"].get(str(engine.pid)))
    probe.attach()
    try:
        t0, t1 = engine.call(f"launch 3000 {name}")
    finally:
        probe.detach()
    rows = rows_of(probe, engine.pid, t0, t1)
    launch = rows["kind"] == "launch"
    assert int(rows["count"][launch].sum()) == 3000
    assert set(rows["kind"]) == {"launch"}
    # summed in the kernel: far fewer rows than calls; long ones named
    assert len(rows["pid"]) < 300
    exact = rows["count"] == 1
    assert set(rows["name"][exact]) <= {name}


def test_syncs_polls_and_copies(probe, engine):
    engine.call("load")
    assert wait_for(lambda: probe.status()["processes"].get(str(engine.pid)))
    probe.attach()
    try:
        spin = engine.call("sync 8000000 spin cuStreamSynchronize_ptsz")
        sleep = engine.call("sync 8000000 sleep cuEventSynchronize")
        ctx = engine.call("sync 3000000 spin cuCtxSynchronize")
        poll = engine.call("poll 8000000 cuStreamQuery")
        copies = engine.call("copy 50 cuMemcpyDtoHAsync_v2_ptsz")
        pointer = engine.call("pointer cuLaunchKernel 200")
    finally:
        probe.detach()
    for (t0, t1), name in ((spin, "cuStreamSynchronize_ptsz"), (sleep, "cuEventSynchronize"),
                           (ctx, "cuCtxSynchronize")):  # fmt: skip
        rows = rows_of(probe, engine.pid, t0, t1)
        one = (rows["kind"] == "sync") & (rows["count"] == 1)
        assert list(rows["name"][one]) == [name]
        # the sync ran until the "GPU" was done: most of the command's time
        assert rows["total_ns"][one][0] >= 0.5 * (t1 - t0)
    rows = rows_of(probe, engine.pid, *poll)
    loops = rows["kind"] == "poll"
    assert int(loops.sum()) >= 1 and int(rows["calls"][loops].sum()) > 1
    # a loop runs from its first query to the one that found the work done
    assert int(rows["total_ns"][loops].sum()) >= 0.5 * (poll[1] - poll[0])
    rows = rows_of(probe, engine.pid, *copies)
    assert int(rows["count"][rows["kind"] == "copy"].sum()) == 50
    # calls through the pointer cuGetProcAddress returned reach the probed entry point
    rows = rows_of(probe, engine.pid, *pointer)
    assert int(rows["count"][rows["kind"] == "launch"].sum()) == 200


def test_a_driver_dlopened_after_tracking_is_found(probe, engine):
    assert wait_for(lambda: str(engine.pid) in probe.status()["idle"])
    assert "no libcuda.so* mapped" in probe.status()["idle"][str(engine.pid)]
    probe.attach()
    try:
        engine.call("load")  # dlopen now, after the probe began following the process
        assert wait_for(lambda: attached(probe, engine.pid))
        t0, t1 = engine.call("launch 1000")
    finally:
        probe.detach()
    rows = rows_of(probe, engine.pid, t0, t1)
    assert int(rows["count"].sum()) == 1000


def test_an_engine_without_the_driver_is_left_alone_and_the_probe_says_why(probe, lib):
    e = Engine(lib)  # never loads it
    try:
        probe.track(e.pid)
        probe.attach()
        try:
            why = wait_for(lambda: probe.status()["idle"].get(str(e.pid)))
            assert why.startswith("no libcuda.so* mapped")
            assert e.pid not in probe.held_uprobes()
        finally:
            probe.detach()
        state = [s for s in probe.sink.statuses if f"pid {e.pid}: idle" in s[3]]
        assert state and "no libcuda.so* mapped" in state[-1][3]
    finally:
        probe.untrack(e.pid)
        e.close()
    assert np.all(rows_of(probe, e.pid).get("pid", np.array([])) != e.pid)


def test_without_uprobe_multi_links_one_uprobe_per_entry_point_is_attached(lib, monkeypatch):
    """A kernel older than 6.6 refuses uprobe_multi links: the probe falls
    back to one uprobe (and uretprobe) per entry point, and counts the same."""
    reason = BccCudaProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    tried = []

    def refused(*args, **kwargs):
        tried.append(args)
        raise OSError(errno.EINVAL, "Invalid argument")

    # two entry points: each classic uprobe costs its detach ~0.1 s here
    two = ("cuLaunchKernel", "cuStreamSynchronize")
    monkeypatch.setattr(cuda_bcc, "link_uprobe_multi", refused)
    monkeypatch.setattr(
        cuda_bcc,
        "entry_points",
        lambda names: {n: f for n, f in entry_points(names).items() if n in two},
    )
    p = BccCudaProbe()
    p.sink = CollectSink()
    p.start(p.sink)
    e = Engine(lib)
    try:
        p.track(e.pid)
        e.call("load")
        assert wait_for(lambda: p.status()["processes"].get(str(e.pid)))
        p.attach()
        try:
            assert tried and p.held_uprobes() == {e.pid: 4}
            t0, t1 = e.call("launch 300 cuLaunchKernel")
        finally:
            p.detach()
        rows = rows_of(p, e.pid, t0, t1)
        assert int(rows["count"][rows["kind"] == "launch"].sum()) == 300
        assert wait_for(lambda: p.held_uprobes() == {})  # closed in the background
    finally:
        p.untrack(e.pid)
        e.close()
        p.stop()
