"""Kernel-cause probes inside a real daemon: coverage rows and a diagnosis window.

A real daemon (bcc sched, page-fault, IRQ, steal and syscall probes) traces a
real probe client; `stallscope deep --for` opens a diagnosis window through
the API. Every probe must have covered the run, the syscall probe exactly
during the window, and syscall rows must fall inside that window only.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from helpers.daemonproc import DaemonProcess
from helpers.privileged import require_privileged
from stallscope.probes.bpf_common import bcc_unavailable

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

HERE = os.path.dirname(os.path.abspath(__file__))


def wait_for(cond, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def daemon(tmp_path):
    reason = bcc_unavailable(["raw_syscalls:sys_enter", "exceptions:page_fault_user"])
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    d = DaemonProcess(
        tmp_path, sched_backend="bcc", extra_args=["--api-socket", str(tmp_path / "api.sock")]
    )
    d.api_socket = str(tmp_path / "api.sock")
    d.start()
    yield d
    if d.proc.poll() is None:
        d.stop()


def deep(daemon, duration):
    return subprocess.run(
        [sys.executable, "-m", "stallscope.cli", "deep", "--for", duration,
         "--api-socket", daemon.api_socket],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_coverage_and_diagnosis_window(daemon, tmp_path):
    stop = tmp_path / "stop"
    client = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "kernel_client.py"), daemon.socket, str(stop)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        me = json.loads(client.stdout.readline())
        assert wait_for(lambda: "connected" in daemon.read_log())
        time.sleep(0.3)  # steps before the window: no syscall rows
        out = deep(daemon, "1s")
        assert out.returncode == 0, out.stderr
        assert "syscalls attached" in out.stdout
        assert wait_for(lambda: "diagnosis window closed" in daemon.read_log())
        time.sleep(0.3)  # steps after the window
    finally:
        stop.touch()
        client.wait(timeout=30)
    assert wait_for(lambda: "disconnected" in daemon.read_log())
    rc, _ = daemon.stop()
    assert rc == 0
    (run_id,) = daemon.query("SELECT run_id FROM runs WHERE pid = ?", [me["pid"]])[0]
    cov = daemon.query(
        "SELECT probe, start_ns, end_ns FROM coverage WHERE run_id = ? ORDER BY probe, start_ns",
        [run_id],
    )
    probes = {p for p, _, _ in cov}
    assert {"sched", "page_faults", "irq", "steal", "syscalls"} <= probes, cov
    assert all(end is not None and end > start for _, start, end in cov), cov
    (sc,) = [(s, e) for p, s, e in cov if p == "syscalls"]
    assert sc[1] - sc[0] >= 1_000_000_000
    (sched,) = [(s, e) for p, s, e in cov if p == "sched"]
    assert sched[0] < sc[0] and sc[1] < sched[1]  # the window lies inside the run
    rows = daemon.query(
        "SELECT min(start_ns), max(end_ns), sum(count) FROM syscalls "
        "WHERE tid = ? AND name = 'getppid'",
        [me["tid"]],
    )[0]
    assert rows[2] and rows[2] >= 200
    assert sc[0] <= rows[0] and rows[1] <= sc[1]
    faults = daemon.query("SELECT sum(count) FROM page_faults WHERE tid = ?", [me["tid"]])[0][0]
    assert faults and faults >= 16
    status = dict(
        (p, (state, detail))
        for p, state, detail in daemon.query(
            "SELECT probe, state, detail FROM probe_status ORDER BY ts_ns"
        )
    )
    assert status["page_faults"][0] == "active" and "ns per fault" in status["page_faults"][1]
    assert status["syscalls"][0] == "active"


def test_deep_refuses_a_bad_duration(daemon):
    out = deep(daemon, "soon")
    assert out.returncode == 2 and "duration like 60s" in out.stderr
