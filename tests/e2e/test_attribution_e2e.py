"""Acceptance: step_attribution recovers causes injected into a real engine.

A real daemon with the eBPF scheduling probe traces the scenario engine while
an injector makes every Nth step slow for a known reason, inside the step:
a blocking sleep, host work inside executor.submit, a full GC pass over a
large heap, or preemption by a SCHED_FIFO process pinned to the engine's CPU.
The injector logs what it did; the test matches each log entry to its step
and compares with the `cause` the SQL assigns. Precision and recall must be
at least 0.95 for every cause, and no step is labelled `gc` unless a GC pass
overlapped it.
"""

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from helpers.daemonproc import DaemonProcess
from helpers.privileged import is_root, require_privileged

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

INJECT_MS = 25
CAUSES = {"block": "blocked", "submit": "submit", "gc": "gc", "preempt": "preemption"}


def _bcc_ok():
    try:
        import bcc  # noqa: F401
    except ImportError:
        return False
    return os.path.isdir("/sys/kernel/tracing/events/sched")


def _raise_priority():
    try:
        os.nice(-10)
    except OSError:
        pass


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("e2e")
    require_privileged(
        is_root() and _bcc_ok(),
        "requires root, bcc (python3-bpfcc) and tracefs: run make test as root",
    )
    daemon = DaemonProcess(tmp_path, sched_backend="bcc").start()
    log = tmp_path / "injected.jsonl"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "stallscope.demo.scenario",
                daemon.socket,
                "--duration",
                "30",
                "--warmup",
                "2",
                "--rate",
                "2",
                "--heap-objects",
                "300000",
                "--label",
                "inject",
                "--inject",
                ",".join(CAUSES),
                "--inject-every",
                "20",
                "--inject-ms",
                str(INJECT_MS),
                "--inject-log",
                str(log),
            ],
            check=True,
            env=env,
            timeout=240,
            # at nice -10, as helpers/cause_engine.py runs: CPU hogs at nice
            # 0 on a shared machine then take ~10 % of the engine's CPU, not
            # half, and far fewer injections are lost to them (the FIFO
            # injection still preempts at will)
            preexec_fn=_raise_priority,
        )
    finally:
        rc, _ = daemon.stop()
    assert rc == 0
    assert "sched probe: using bcc" in daemon.read_log()
    injected = [json.loads(line) for line in log.read_text().splitlines()]
    return daemon, injected


def test_injected_causes_are_recovered(traced_run):
    daemon, injected = traced_run
    assert len(injected) >= 40, f"only {len(injected)} injections ran"
    rows = daemon.query("""
        SELECT a.start_ns, a.end_ns, a.tid, a.cause, a.gc_ns, a.preempted_ns, a.blocked_ns,
               a.submit_excess_ns, a.excess_ns, coalesce(a.runq_ns, 0), a.preemptor_comm
        FROM step_attribution a""")
    steps = sorted(rows)
    assert len(steps) > 500
    starts = [s[0] for s in steps]

    import bisect

    truth = {}  # step start_ns -> injected cause label
    for inj in injected:
        i = bisect.bisect_right(starts, inj["start_ns"]) - 1
        assert i >= 0
        step = steps[i]
        assert step[0] <= inj["start_ns"] and inj["end_ns"] <= step[1], (inj, step)
        truth[step[0]] = CAUSES[inj["cause"]]

    predicted = {s[0]: s[3] for s in steps}
    # On a loaded machine the engine is also preempted by processes the test
    # did not start, or waits for a CPU. When that unplanned time inside an
    # injected step (the daemon's own preemption and run-queue rows; for a
    # preempt injection, what exceeds the injected 25 ms) is at least half
    # the injected time, it is a competing cause as large and the injection
    # is no longer ground truth: such steps are left out of the score
    # (counted), never relabelled; more than 10 % left out fails the test.
    inject_ns = INJECT_MS * 1_000_000
    competing = {
        s[0]: (s[9] + max(0, (s[5] or 0) - inject_ns))
        if truth.get(s[0]) == "preemption"
        else (s[9] + (s[5] or 0))
        for s in steps
    }
    contaminated = {k for k in truth if competing[k] >= inject_ns // 2}
    by_start = {s[0]: s for s in steps}
    # (injected, run-queue ms, preempted ms, first preemptor) of each
    left = sorted(
        (truth[k], by_start[k][9] // 10**6, (by_start[k][5] or 0) // 10**6, by_start[k][10])
        for k in contaminated
    )
    assert len(contaminated) <= 0.10 * len(truth), (
        f"{len(contaminated)} of {len(truth)} injections left out for CPU contention ({left}): "
        "the machine was too busy to tell the causes"
    )
    truth = {k: v for k, v in truth.items() if k not in contaminated}
    confusion = Counter((truth[k], predicted[k]) for k in truth)
    report = (
        f"(expected, got) counts: {dict(confusion)}; "
        f"{len(contaminated)} injected steps left out for CPU contention {left}"
    )
    print(report)
    for label in CAUSES.values():
        injected_n = sum(1 for v in truth.values() if v == label)
        hit = confusion[(label, label)]
        labelled_injected = sum(n for (t, p), n in confusion.items() if p == label)
        recall = hit / injected_n
        precision = hit / labelled_injected if labelled_injected else 0.0
        assert injected_n >= 8, report
        assert recall >= 0.95, f"{label}: recall {recall:.2f}; {report}"
        assert precision >= 0.95, f"{label}: precision {precision:.2f}; {report}"


def test_no_step_is_gc_without_a_gc_pass(traced_run):
    daemon, _ = traced_run
    wrong = daemon.scalar("""
        SELECT count(*) FROM step_attribution a
        WHERE a.cause = 'gc' AND NOT EXISTS (
            SELECT 1 FROM gc_events g
            WHERE g.run_id = a.run_id AND g.start_ns < a.end_ns AND a.start_ns < g.end_ns)""")
    assert wrong == 0
    assert daemon.scalar("SELECT count(*) FROM step_attribution WHERE cause = 'gc'") > 0
