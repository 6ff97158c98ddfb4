"""The unit's system-call allow list admits everything the daemon really does:
a real daemon under `strace -f -c` (best available sched backend, socket
activation, a probe client, a SIGHUP reload, retention deleting runs,
SIGTERM), and every system call it made must be in the resolved
SystemCallFilter= set of systemd/stallscope.service."""

import os
import signal
import time

import pytest

import probe_client
from helpers.systemd import REPO, ServiceProcess, allowed_syscalls, have, strace_summary_syscalls

pytestmark = [
    pytest.mark.skipif(
        not (have("strace") and have("systemd-analyze") and have("systemd-socket-activate")),
        reason="needs strace, systemd-analyze and systemd-socket-activate",
    ),
    pytest.mark.daemon,
]

CONFIG = (
    '[probes]\ngpu_backend = "none"\nsched_poll_hz = {hz}\n'
    "[retention]\nmax_db_mb = 0.001\ncheck_interval_s = 1\n"
)


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def test_daemon_syscalls_are_in_the_units_allow_list(tmp_path):
    summary = tmp_path / "strace.txt"
    sock = str(tmp_path / "activated.sock")
    svc = ServiceProcess(
        tmp_path,
        CONFIG.format(hz=100),
        prefix=[
            "strace",
            "-f",
            "-qq",
            "-c",
            "-S",
            "name",
            "-o",
            str(summary),
            "systemd-socket-activate",
            "--seqpacket",
            "--fdname=probe",
            "-l",
            sock,
            "-E",
            "PYTHONPATH",
            "-E",
            "STALLSCOPE_CONFIG",
        ],
    )
    svc.start()
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for label in ("first", "second"):
            probe = probe_client.connect(socket_path=sock, run_label=label)
            for i in range(2000):
                probe.end("step", probe.begin(), stage="s", batch=i % 3)
            probe.close()
            svc.wait_log(f"connected ({label})", timeout_s=60)
        daemon_pids = children(svc.proc.pid)
        assert len(daemon_pids) == 1, daemon_pids
        svc.config.write_text(CONFIG.format(hz=50))
        os.kill(daemon_pids[0], signal.SIGHUP)
        svc.wait_log("configuration reloaded")
        svc.wait_log("stallscope.retention INFO retention")
        os.kill(daemon_pids[0], signal.SIGTERM)
        assert svc.proc.wait(timeout=60) == 0
    finally:
        svc.kill()
    used = strace_summary_syscalls(summary)
    assert len(used) > 30, summary.read_text()
    # systemd-socket-activate's own exec and set-up are the manager's job, not
    # the service's; everything else is the daemon's.
    allowed = allowed_syscalls((REPO / "systemd" / "stallscope.service").read_text())
    assert not used - allowed, (
        f"system calls the unit would refuse with EPERM: {sorted(used - allowed)}"
    )
