"""GPU waits and launch storms come back as `gpu_wait` and `launch`: real daemon, real uprobes.

A real daemon (bcc sched probe, the CUDA driver probe attached for its life
with --deep) traces three engines on the fake driver (tests/cuda/
fake_libcuda.c, built here under the real driver's file name), one per way
of waiting for the GPU: a spinning sync, a sleeping sync and a polling loop
of cuEventQuery. Each engine's steps launch a few kernels and wait ~2 ms
for the "GPU"; at known steps the GPU takes 25 ms longer (an injected long
sync) or the step launches 4,000 kernels of 4 us each (a launch storm).
step_attribution must name those steps `gpu_wait` and `launch` with
precision and recall of at least 0.95 over all engines, and a sleeping
sync must never be called `blocked`.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import fakecuda
from helpers.daemonproc import DaemonProcess
from helpers.privileged import require_privileged
from helpers.waiting import wait_for
from stallscope.probes.cuda_bcc import BccCudaProbe

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

ENGINE = Path(__file__).resolve().parents[1] / "cuda" / "cuda_engine.py"
STEPS = 240
GPU_STEPS = set(range(15, STEPS, 20))  # the GPU takes 25 ms longer
STORM_STEPS = set(range(25, STEPS, 20))  # 4,000 launches of 4 us
MIN_SCORE = 0.95


def plan(sync, start_file):
    inject = {i: {"gpu_ns": 27_000_000} for i in GPU_STEPS}
    inject.update({i: {"launches": 4000, "launch_ns": 4000} for i in STORM_STEPS})
    return {"steps": STEPS, "launches": 20, "gpu_ns": 2_000_000, "sync": sync,
            "gap_s": 0.002, "inject": inject, "start_file": str(start_file)}  # fmt: skip


@pytest.fixture
def daemon(tmp_path):
    reason = BccCudaProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    fakecuda.require_cc()
    d = DaemonProcess(
        tmp_path, sched_backend="bcc", extra_args=["--cuda-driver", "--deep", "--no-kernel-causes"]
    )
    d.start()
    yield d
    if d.proc.poll() is None:
        d.stop()


def run_engine(daemon, lib, sync, tmp_path):
    start = tmp_path / f"start-{sync}"
    plan_path = tmp_path / f"plan-{sync}.json"
    plan_path.write_text(json.dumps(plan(sync, start)))
    proc = subprocess.Popen(
        [sys.executable, str(ENGINE), "steps", daemon.socket, str(lib), str(plan_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # its steps begin once the driver's entry points are attached in it
        assert wait_for(
            lambda: f"pid {proc.pid}: 29 entry points attached" in daemon.read_log(), 30
        ), daemon.read_log()[-2000:]
        start.touch()
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    return json.loads(out.strip().splitlines()[-1])


def test_gpu_waits_and_launch_storms_are_named(daemon, tmp_path):
    lib = fakecuda.build(tmp_path)
    engines = {sync: run_engine(daemon, lib, sync, tmp_path) for sync in ("spin", "sleep", "poll")}
    rc, _ = daemon.stop()
    assert rc == 0
    hits = {"gpu_wait": [0, 0, 0], "launch": [0, 0, 0]}  # [right, named so, injected]
    for sync, eng in engines.items():
        (run_id,) = daemon.query("SELECT run_id FROM runs WHERE pid = ?", [eng["pid"]])[0]
        cov = daemon.query(
            "SELECT count(*) FROM coverage WHERE run_id = ? AND probe = 'cuda'", [run_id]
        )[0][0]
        assert cov >= 1
        rows = daemon.query(
            "SELECT start_ns, cause, gpu_wait_ns, launch_ns, blocked_ns, cuda_launches, "
            "cuda_sync_ns FROM step_attribution WHERE run_id = ? ORDER BY start_ns",
            [run_id],
        )
        by_start = {r[0]: r for r in rows}
        assert len(rows) == STEPS
        for i, t0 in enumerate(eng["starts"]):
            _, cause, gpu_wait, launch, blocked, launches, sync_ns = by_start[t0]
            # every launch counted, summary rows pro-rated to the step
            assert abs(launches - (4000 if i in STORM_STEPS else 20)) <= 1, (sync, i, launches)
            for name, injected in (("gpu_wait", GPU_STEPS), ("launch", STORM_STEPS)):
                hits[name][0] += cause == name and i in injected
                hits[name][1] += cause == name
                hits[name][2] += i in injected
            if i in GPU_STEPS:
                assert cause != "blocked", (sync, i, rows[i])
                assert sync_ns >= 20_000_000, (sync, i, sync_ns)
                if sync == "sleep":
                    # the sleep is the GPU's: not left in blocked
                    assert (blocked or 0) < 0.1 * gpu_wait, (i, blocked, gpu_wait)
    for name, (right, named, injected) in hits.items():
        assert right / injected >= MIN_SCORE, f"{name} recall {right}/{injected}"
        assert right / max(named, 1) >= MIN_SCORE, f"{name} precision {right}/{named}"
