"""Helpers for the systemd tests: a NOTIFY_SOCKET listener and a daemon process
started the way systemd starts it (environment, config file, signals)."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[2]


def have(tool):
    return shutil.which(tool) is not None


class NotifyListener:
    """A real sd_notify receiver: an AF_UNIX datagram socket, by path or abstract."""

    def __init__(self, path=None, abstract=None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            self.sock.bind("\0" + abstract)
            self.address = "@" + abstract
        else:
            self.sock.bind(str(path))
            self.address = str(path)
        self.sock.settimeout(0.1)
        self.messages = []  # (monotonic s, {key: value}) in arrival order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().split("\n") if "=" in line)
            self.messages.append((time.monotonic(), fields))

    def wait_for(self, key, value=None, timeout_s=30, after=0, pred=None):
        """The first message at index >= after with key (=value, pred(value)); its index."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for i, (_, fields) in enumerate(list(self.messages)[after:], after):
                if (
                    key in fields
                    and (value is None or fields[key] == value)
                    and (pred is None or pred(fields[key]))
                ):
                    return i
            time.sleep(0.02)
        raise AssertionError(
            f"no {key}={value or '*'} notification in {timeout_s} s; got "
            f"{[m for _, m in self.messages]}"
        )

    def times(self, key):
        return [t for t, fields in list(self.messages) if key in fields]

    def statuses(self):
        return [fields["STATUS"] for _, fields in list(self.messages) if "STATUS" in fields]

    def close(self):
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


class ServiceProcess:
    """`stallscope daemon` with a config file and a systemd-like environment
    (no CPU sampler unless `args` holds --cpu-sampler)."""

    def __init__(self, tmp_path, config_text="", env=None, args=(), prefix=()):
        self.dir = Path(tmp_path)
        self.socket = str(self.dir / "probe.sock")
        self.db = str(self.dir / "state.duckdb")
        self.config = self.dir / "stallscope.toml"
        self.config.write_text(config_text)
        self.log = self.dir / "daemon.log"
        self.env = dict(os.environ)
        for var in (
            "NOTIFY_SOCKET",
            "WATCHDOG_USEC",
            "WATCHDOG_PID",
            "LISTEN_FDS",
            "LISTEN_PID",
            "LISTEN_FDNAMES",
        ):
            self.env.pop(var, None)
        self.env.update(env or {})
        self.args = list(args)
        self.prefix = list(prefix)
        self.proc = None

    def command(self):
        return (
            self.prefix
            + [
                sys.executable,
                "-m",
                "stallscope.cli",
                "daemon",
                "--config",
                str(self.config),
                "--socket",
                self.socket,
                "--db",
                self.db,
            ]
            # The CPU sampler (root only, ~3 s to load) only where a test asks for it.
            + ([] if "--cpu-sampler" in self.args else ["--no-cpu-sampler"])
            # the sampler's tests count samples by the timer ("auto" picks by host)
            + (
                ["--cpu-sample-clock", "timer"]
                if "--cpu-sampler" in self.args
                and not any(a.startswith("--cpu-sample-clock") for a in self.args)
                else []
            )
            # likewise the CUDA driver probe (a bcc program to load)
            + ([] if "--cuda-driver" in self.args else ["--no-cuda-driver"])
            + self.args
        )

    def start(self):
        self._logf = open(self.log, "a")
        self.proc = subprocess.Popen(
            self.command(), env=self.env, stdout=self._logf, stderr=subprocess.STDOUT, cwd=REPO
        )
        return self

    def read_log(self):
        return self.log.read_text()

    def wait_log(self, text, timeout_s=30):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.read_log():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not in the daemon's log:\n{self.read_log()}")

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, timeout_s=20):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=timeout_s)
        self._logf.close()
        return rc

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def query(self, sql, params=None):
        con = duckdb.connect(self.db, read_only=True)
        try:
            return con.execute(sql, params or []).fetchall()
        finally:
            con.close()


def proc_backend_available():
    """True when the /proc scheduling backend is part of this tree (merged)."""
    try:
        from stallscope.probes import registry

        cls, _ = registry.select_backend("sched", prefer="proc")
        return cls is not None
    except Exception:
        return False


def syscall_groups():
    """{'@group': [members]} as this systemd defines them."""
    out = subprocess.run(
        ["systemd-analyze", "syscall-filter"], capture_output=True, text=True, check=True
    ).stdout
    groups, current = {}, None
    for line in out.splitlines():
        if line.startswith("@"):
            current = line.split()[0]
            groups[current] = []
        elif current and line.strip() and not line.strip().startswith("#"):
            groups[current].append(line.strip().split()[0])
    return groups


def allowed_syscalls(unit_text):
    """The final allow set of a unit's SystemCallFilter= lines (allow list first,
    then ~deny lines remove and plain lines add, in order, as systemd merges them)."""
    groups = syscall_groups()

    def expand(name):
        if name.startswith("@"):
            return (
                set().union(*(expand(m) for m in groups.get(name, [])))
                if groups.get(name)
                else set()
            )
        return {name}

    allow = None
    for line in unit_text.splitlines():
        line = line.strip()
        if not line.startswith("SystemCallFilter="):
            continue
        value = line.split("=", 1)[1]
        names = set().union(*(expand(t) for t in value.lstrip("~").split()))
        if allow is None:
            assert not value.startswith("~"), "expected an allow list first"
            allow = set()
        if value.startswith("~"):
            allow -= names
        else:
            allow |= names
    return allow or set()


def strace_summary_syscalls(path):
    """Syscall names from an `strace -c` summary file."""
    names = set()
    for line in Path(path).read_text().splitlines()[2:]:
        parts = line.split()
        if (
            parts
            and parts[-1].replace("_", "").isalnum()
            and parts[-1] != "total"
            and not parts[-1].startswith("-")
        ):
            names.add(parts[-1])
    return names
