"""Shared helpers for the fault suite: client processes, reconciliation, RSS."""

import json
import os
import subprocess
import sys
import time

from daemonproc import DaemonProcess

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(HERE, "clientproc.py")


def start_client(socket_path, rate, duration_s, label, ready=None):
    cmd = [sys.executable, CLIENT, socket_path, str(rate), str(duration_s), label]
    if ready:
        cmd += ["--ready", ready]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_client(proc, timeout_s=120):
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def wait_for(pred, timeout_s=10.0, every_s=0.02):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(every_s)
    return False


def reconcile(daemon, stats):
    """Per client: its run's stored records and reported losses, from the
    database (the daemon must be stopped), next to what the client made."""
    rows = []
    for st in stats:
        runs = daemon.query(
            "SELECT run_id, connections FROM runs WHERE client_token = ? AND pid = ?",
            [st["run_token"], st["pid"]],
        )
        assert len(runs) == 1, (st, runs)
        run_id, connections = runs[0]
        stored = daemon.scalar(
            "SELECT (SELECT count(*) FROM spans WHERE run_id = $1) + "
            "(SELECT count(*) FROM gc_events WHERE run_id = $1)",
            [run_id],
        )
        lost = daemon.scalar(
            "SELECT coalesce(sum(count), 0)::BIGINT FROM losses WHERE run_id = ?", [run_id]
        )
        dup = daemon.scalar(
            "SELECT count(*) - count(DISTINCT seq) FROM spans WHERE run_id = ?", [run_id]
        )
        rows.append(
            {
                "run_id": run_id,
                "made": st["next_seq"],
                "sent": st["sent_records"],
                "stored": stored,
                "lost": lost,
                "duplicates": dup,
                "connections": connections,
                "drops_full": st["drops_full"],
                "drops_disconnected": st["drops_disconnected"],
            }
        )
    return rows


def vm_hwm_kb(pid):
    """Peak resident set size of a process (VmHWM), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return None


class Daemon(DaemonProcess):
    """DaemonProcess with a database path of our choosing and, optionally,
    module constants set before the daemon starts (e.g. the store's bound)."""

    def __init__(self, tmp_path, db=None, patch=None, **kw):
        super().__init__(tmp_path, **kw)
        if db:
            self.db = db
        self.patch = patch or {}

    def start(self, wait=True):
        # The log is appended to across restarts: readiness and later checks
        # look only at what this start wrote.
        self.log_offset = os.path.getsize(self.log) if os.path.exists(self.log) else 0
        if not self.patch:
            return super().start(wait)
        code = "import sys, importlib\n"
        for (mod, name), value in self.patch.items():
            code += f"setattr(importlib.import_module({mod!r}), {name!r}, {value!r})\n"
        code += "from stallscope.cli import main\nsys.exit(main(sys.argv[1:]))\n"
        cmd = [
            sys.executable,
            "-c",
            code,
            "daemon",
            "--socket",
            self.socket,
            "--db",
            self.db,
            "--gpu-backend",
            "none",
            "--sched-backend",
            self.sched_backend or "none",
        ]
        cmd += self.extra_args
        import subprocess as sp

        self._logf = open(self.log, "a")
        self.proc = sp.Popen(cmd, stdout=self._logf, stderr=self._logf)
        if wait:
            self.wait_ready()
        return self

    def new_log(self):
        """What the daemon logged since its latest start."""
        with open(self.log, errors="replace") as f:
            f.seek(self.log_offset)
            return f.read()

    def wait_ready(self, timeout_s=30):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}:\n{self.new_log()}")
            if os.path.exists(self.socket) and "listening on" in self.new_log():
                return
            time.sleep(0.02)
        raise RuntimeError(f"daemon not ready:\n{self.new_log()}")


def require_root():
    """Skip without root; in CI (STALLSCOPE_REQUIRE_PRIVILEGED=1) fail instead,
    as tests/conftest.py's require_privileged does."""
    import pytest

    if os.geteuid() == 0:
        return
    if os.environ.get("STALLSCOPE_REQUIRE_PRIVILEGED") == "1":
        pytest.fail("required in CI but unavailable: needs root (mount, setuid)", pytrace=False)
    pytest.skip("needs root (mount, setuid)")
