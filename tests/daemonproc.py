"""A real `stallscope daemon` child process for tests."""

import os
import signal
import subprocess
import sys
import time

import duckdb


class DaemonProcess:
    def __init__(self, tmp_path, sched_backend="none", extra_args=()):
        self.dir = tmp_path
        self.socket = str(tmp_path / "probe.sock")
        self.db = str(tmp_path / "test.duckdb")
        self.log = str(tmp_path / "daemon.log")
        self.sched_backend = sched_backend
        self.extra_args = list(extra_args)
        self.proc = None

    def start(self, wait=True):
        cmd = [
            sys.executable,
            "-m",
            "stallscope.cli",
            "daemon",
            "--socket",
            self.socket,
            "--db",
            self.db,
            "--gpu-backend",
            "none",
        ]
        if self.sched_backend:
            cmd += ["--sched-backend", self.sched_backend]
        if self.sched_backend == "none" and "--kernel-causes" not in self.extra_args:
            # no kernel probes at all unless a test asks (they need root and
            # take ~1 s to load)
            cmd += ["--no-kernel-causes"]
        cmd += self.extra_args
        self._logf = open(self.log, "a")
        self.proc = subprocess.Popen(cmd, stdout=self._logf, stderr=self._logf)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout_s=30):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}:\n{self.read_log()}")
            if os.path.exists(self.socket) and "listening on" in self.read_log():
                return
            time.sleep(0.05)
        raise RuntimeError(f"daemon not ready:\n{self.read_log()}")

    def read_log(self):
        with open(self.log) as f:
            return f.read()

    def stop(self, timeout_s=10):
        """SIGTERM; returns (exit status, seconds it took)."""
        if self.proc is None or self.proc.poll() is not None:
            return (self.proc.returncode if self.proc else None), 0.0
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=timeout_s)
        self._logf.close()
        return rc, time.monotonic() - t0

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        self._logf.close()

    def query(self, sql, params=None):
        """Query the database file (the daemon must be stopped)."""
        con = duckdb.connect(self.db, read_only=True)
        try:
            return con.execute(sql, params or []).fetchall()
        finally:
            con.close()

    def scalar(self, sql, params=None):
        return self.query(sql, params)[0][0]
