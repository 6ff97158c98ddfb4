"""Acceptance (raw tables): kernel causes injected into a real traced engine are named.

A real daemon with every kernel probe attached for its life (`--deep`) traces
`helpers/cause_engine.py --profile kernel`, which makes every Nth step slow by a syscall burst, a
first-touch page-fault burst, a GIL-holding sibling thread, or a preemption
by a named SCHED_FIFO process. Each injected step must be found in the raw
tables (syscalls, page_faults, offcpu's waker and preemptor columns) with the
right thread or process named, and steps without that injection must not be
(precision and recall >= 0.95). The views turn these rows into causes.
"""

import json
import os
import subprocess
import sys

import pytest

from helpers.daemonproc import DaemonProcess
from helpers.privileged import require_privileged
from stallscope.probes.bpf_common import bcc_unavailable

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

HERE = os.path.dirname(os.path.abspath(__file__))
CAUSE_ENGINE = os.path.join(os.path.dirname(HERE), "helpers", "cause_engine.py")
STEPS, EVERY = 900, 10  # about 20 injections of each cause


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    reason = bcc_unavailable(["raw_syscalls:sys_enter", "exceptions:page_fault_user"])
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    tmp_path = tmp_path_factory.mktemp("kernel-e2e")
    daemon = DaemonProcess(tmp_path, sched_backend="bcc", extra_args=["--deep"]).start()
    log = tmp_path / "injected.jsonl"
    try:
        subprocess.run(
            [sys.executable, CAUSE_ENGINE, daemon.socket, str(log),
             str(STEPS), str(EVERY), "--profile", "kernel"],
            check=True, timeout=240,
        )  # fmt: skip
    finally:
        rc, _ = daemon.stop()
    assert rc == 0
    injected = [json.loads(line) for line in log.read_text().splitlines()]
    steps = daemon.query("SELECT start_ns, end_ns, tid FROM spans WHERE kind = 'step'")
    return daemon, injected, sorted(steps)


def per_step(daemon, value, table, where, params=()):
    """{step start_ns: `value` over the rows of `table` (alias x) of the step's
    thread that overlap the step and satisfy `where`}, for every step."""
    rows = daemon.query(
        f"SELECT s.start_ns, {value} FROM spans s LEFT JOIN {table} x ON x.tid = s.tid "
        f"AND x.start_ns < s.end_ns AND s.start_ns < x.end_ns AND {where} "
        "WHERE s.kind = 'step' GROUP BY s.start_ns",
        list(params),
    )
    return dict(rows)


def check(name, flagged, truth):
    hit = len(flagged & truth)
    recall = hit / len(truth)
    precision = hit / len(flagged) if flagged else 0.0
    assert len(truth) >= 10, f"{name}: only {len(truth)} injections"
    assert recall >= 0.95 and precision >= 0.95, (
        f"{name}: recall {recall:.2f}, precision {precision:.2f} "
        f"(missed {sorted(truth - flagged)[:5]}, extra {sorted(flagged - truth)[:5]})"
    )


def truth_of(injected, steps, cause):
    starts = {s for s, _, _ in steps}
    out = set()
    for inj in injected:
        if inj["cause"] == cause:
            assert inj["start_ns"] in starts, inj
            out.add(inj["start_ns"])
    return out


def test_syscall_burst_is_in_its_step(traced):
    daemon, injected, steps = traced
    calls = per_step(daemon, "coalesce(sum(x.count), 0)", "syscalls", "x.name = 'getppid'")
    truth = truth_of(injected, steps, "syscalls")
    check("syscalls", {s for s, n in calls.items() if n >= 10_000}, truth)
    # the burst's calls are all there, and in no other step
    assert all(calls[s] == 20_000 for s in truth), [calls[s] for s in truth]


def test_fault_burst_is_in_its_step(traced):
    daemon, injected, steps = traced
    faults = per_step(daemon, "coalesce(sum(x.count), 0)", "page_faults", "true")
    truth = truth_of(injected, steps, "faults")
    check("page_faults", {s for s, n in faults.items() if n >= 1500}, truth)
    cost = daemon.query("SELECT count(*) FROM page_faults WHERE cost_ns IS NULL")[0][0]
    assert cost == 0


def test_gil_holder_is_the_waker(traced):
    daemon, injected, steps = traced
    hog = {inj["who"] for inj in injected if inj["cause"] == "gil"}
    assert len(hog) == 1
    (hog_tid,) = hog
    woken = per_step(
        daemon,
        "count(x.tid)",
        "offcpu",
        "NOT x.preempted AND x.waker_tid = ? AND x.waker_comm = 'stall-gil'",
        [hog_tid],
    )
    check("gil", {s for s, n in woken.items() if n > 0}, truth_of(injected, steps, "gil"))


def test_fifo_process_is_the_preemptor(traced):
    daemon, injected, steps = traced
    fifo = {inj["who"] for inj in injected if inj["cause"] == "preempt"}
    assert len(fifo) == 1
    (fifo_pid,) = fifo
    preempted = per_step(
        daemon,
        "count(x.tid)",
        "offcpu",
        "x.preempted AND x.preemptor_pid = ? AND x.preemptor_comm = 'stall-fifo'",
        [fifo_pid],
    )
    check(
        "preempt", {s for s, n in preempted.items() if n > 0}, truth_of(injected, steps, "preempt")
    )


def test_every_probe_covered_the_run(traced):
    daemon, _, _ = traced
    probes = {p for (p,) in daemon.query("SELECT DISTINCT probe FROM coverage")}
    assert {"sched", "page_faults", "irq", "steal", "syscalls"} <= probes
