"""GPU waits and launch storms come back as `gpu_wait` and `launch`: real daemon, real uprobes.

A real daemon (bcc sched probe, the CUDA driver probe attached for its life
with --deep) traces three engines on the fake driver (tests/cuda/
fake_libcuda.c, built here under the real driver's file name), one per way
of waiting for the GPU: a spinning sync, a sleeping sync and a polling loop
of cuEventQuery. Each engine's steps launch a few kernels and wait ~20 ms
for the "GPU" (long enough that the slow threshold, 1.2 x, lies above this
machine's timer and wake-up jitter); at known steps the GPU takes 25 ms
longer (an injected long sync) or the step launches 600 kernels of 10 us
each (a launch storm).
step_attribution must name those steps `gpu_wait` and `launch` with
precision and recall of at least 0.95 over all engines, and a sleeping
sync must never be called `blocked`. As in test_attribution_e2e.py, an
injected step that the loaded machine preempted or kept waiting for a CPU
at least half as long as the injection itself took is no longer ground
truth: it is left out of the score (listed), never relabelled, and more
than 10 % left out fails the test. The same holds for time the kernel
never saw: a sync that came back well after the "GPU" was done while its
thread never left the CPU (a hypervisor's steal on a shared VM, 4-14 ms
seen) is host time a real driver could not tell from the GPU's either. A
step whose such hidden overshoot is at least half the rest of its excess is
the machine's: an injected one is left out, an uninjected one named
`gpu_wait` is not counted against precision (both listed; at most 10 % and
5 % of the steps). Likewise an uninjected step named `launch` whose launch
calls took, by the engine's own clock, at least half its excess longer than
its engine's median launch phase: the machine slowed the launches
themselves (20 of them, normally ~0.3 ms), which is what `launch` says.
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
GPU_STEPS = set(range(15, STEPS, 10))  # the GPU takes 25 ms longer
# 600 launches of 10 us (~12 ms with the probe's cost), run under SCHED_FIFO:
# a busy shared machine (fair shares between sessions, whatever the nice
# value) otherwise preempts half of any CPU burst of several ms at its
# ticks, a competing cause as large that leaves the step out of the score
STORM_STEPS = set(range(20, STEPS, 10))
STORM = {"launches": 600, "launch_ns": 10_000, "fifo": True}
MIN_SCORE = 0.95
ENTRY_POINTS = len(fakecuda.LAUNCHES + fakecuda.SYNCS + fakecuda.QUERIES + fakecuda.COPIES)


def plan(sync, start_file):
    inject = {i: {"gpu_ns": 45_000_000} for i in GPU_STEPS}
    inject.update({i: STORM for i in STORM_STEPS})
    return {"steps": STEPS, "launches": 20, "gpu_ns": 20_000_000, "sync": sync,
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


def ms(ns):
    return None if ns is None else round(ns / 1e6, 1)


def hidden_overshoot_ns(gpu_done_ns, back_ns, offcpu):
    """How long a sync came back after the "GPU" was done, less the time the
    kernel saw its thread off the CPU meanwhile (that part the tool sees)."""
    seen = sum(max(0, min(b, back_ns) - max(a, gpu_done_ns)) for a, b in offcpu)
    return max(0, back_ns - gpu_done_ns - seen)


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
            lambda: f"pid {proc.pid}: {ENTRY_POINTS} entry points attached" in daemon.read_log(), 30
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
    rc, _ = daemon.stop(timeout_s=60)
    assert rc == 0
    truth, predicted, left, excused, shape = {}, {}, [], [], {}
    for sync, eng in engines.items():
        (run_id,) = daemon.query("SELECT run_id FROM runs WHERE pid = ?", [eng["pid"]])[0]
        cov = daemon.query(
            "SELECT count(*) FROM coverage WHERE run_id = ? AND probe = 'cuda'", [run_id]
        )[0][0]
        assert cov >= 1
        rows = daemon.query(
            "SELECT start_ns, cause, gpu_wait_ns, launch_ns, blocked_ns, cuda_launches, "
            "cuda_sync_ns, excess_ns, coalesce(preempted_ns, 0) + coalesce(runq_ns, 0), "
            "preemptor_comm FROM step_attribution WHERE run_id = ? ORDER BY start_ns",
            [run_id],
        )
        by_start = {r[0]: r for r in rows}
        assert len(rows) == STEPS
        off = daemon.query(
            "SELECT start_ns, end_ns FROM offcpu WHERE pid = ? AND tid = ?",
            [eng["pid"], eng["tid"]],
        )
        quiet = [eng["launched"][i] for i in range(STEPS) if i not in GPU_STEPS | STORM_STEPS]
        launch_median = sorted(quiet)[len(quiet) // 2]
        for i, t0 in enumerate(eng["starts"]):
            _, cause, gpu_wait, _, blocked, launches, sync_ns, excess, competing, who = by_start[t0]
            key = (sync, i)
            predicted[key] = cause
            shape[key] = (ms(sync_ns), ms(excess), ms(competing), who, ms(eng["launched"][i]))
            # every launch counted, in its own step
            assert launches == (STORM["launches"] if i in STORM_STEPS else 20), (key, launches)
            if i in GPU_STEPS:
                assert cause != "blocked", (key, by_start[t0])
                # (a polling loop runs from its first query; a preemption of
                # more than cuda_poll_gap_us between two queries splits it)
                assert sync_ns >= (40_000_000 if sync != "poll" else 25_000_000), (key, sync_ns)
                if sync == "sleep":
                    # the sleep is the GPU's: not left in blocked
                    assert (blocked or 0) < 0.1 * gpu_wait, (key, blocked, gpu_wait)
            slowed = eng["launched"][i] - launch_median
            if i not in GPU_STEPS | STORM_STEPS and cause == "launch" and excess > 0:
                if slowed >= excess / 2:  # the launch calls themselves were slow
                    excused.append((key, ms(slowed), "launch calls"))
                    del predicted[key]
                    continue
            hidden = hidden_overshoot_ns(*eng["syncs"][i], off)
            if hidden >= (excess - hidden) / 2 and excess > 0:  # the machine's, unseen
                if i not in GPU_STEPS | STORM_STEPS:
                    if cause == "gpu_wait":
                        excused.append((key, ms(hidden)))
                        del predicted[key]
                    continue
                left.append((key, hidden // 10**6, "hidden"))
                continue
            if i not in GPU_STEPS | STORM_STEPS:
                continue
            if competing >= (excess - competing) / 2:  # the machine's, not the injection's
                left.append((key, competing // 10**6, who))
                continue
            truth[key] = "gpu_wait" if i in GPU_STEPS else "launch"
    injected = len(GPU_STEPS | STORM_STEPS) * len(engines)
    report = f"{len(left)} of {injected} injections left out for CPU contention: {left}"
    report += f"; {len(excused)} uninjected steps named for the machine's time: {excused}"
    assert len(left) <= 0.10 * injected, f"the machine was too busy to tell the causes: {report}"
    assert len(excused) <= 0.05 * (STEPS * len(engines) - injected), report
    for name in ("gpu_wait", "launch"):
        mine = [k for k, v in truth.items() if v == name]
        right = sum(predicted[k] == name for k in mine)
        named = sum(predicted[k] == name for k in predicted)
        wrong = {k: predicted[k] for k in mine if predicted[k] != name}
        assert right / len(mine) >= MIN_SCORE, (
            f"{name} recall {right}/{len(mine)} {wrong}; {report}"
        )
        others = sorted(
            (k, shape[k]) for k in predicted if predicted[k] == name and truth.get(k) != name
        )
        assert right / max(named, 1) >= MIN_SCORE, (
            f"{name} precision {right}/{named} (also named so: {others}); {report}"
        )
