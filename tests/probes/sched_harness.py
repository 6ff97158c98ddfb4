"""Real scheduling scenarios and the kernel's own counters, shared by the sched probe tests.

Drives `sched_workload.py` in a child process (its worker thread is created
after tracking starts), a CPU hog pinned to the CPU the worker spins on, and
reads the kernel's per-thread truth from /proc (status, schedstat, sched)
around each window while the worker sleeps. It never asserts on wall time;
it only returns what the probe and the kernel said.
"""

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

WORKLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sched_workload.py")


class CollectSink:
    """A Sink that keeps every batch, for tests."""

    def __init__(self):
        self.batches = {}
        self.losses = []

    def append(self, table, columns):
        self.batches.setdefault(table, []).append(
            {k: np.asarray(v) for k, v in columns.items()})

    def loss(self, probe, start_ns, end_ns, count, reason):
        self.losses.append((probe, start_ns, end_ns, count, reason))

    def table(self, name, tid=None):
        """All rows of `name` as one dict of arrays, optionally for one tid."""
        parts = self.batches.get(name, [])
        if not parts:
            return {}
        cols = {k: np.concatenate([p[k] for p in parts if k in p]) for k in parts[0]}
        if tid is not None:
            sel = cols["tid"] == tid
            cols = {k: v[sel] for k, v in cols.items()}
        return cols


def proc_counters(pid, tid, proc_root="/proc"):
    base = f"{proc_root}/{pid}/task/{tid}"
    out = {}
    with open(f"{base}/schedstat") as f:
        run_ns, wait_ns, slices = (int(x) for x in f.read().split())
    out.update(run_ns=run_ns, wait_ns=wait_ns, slices=slices)
    with open(f"{base}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                out["voluntary"] = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                out["nonvoluntary"] = int(line.split()[1])
    with open(f"{base}/sched") as f:
        for line in f:
            if line.startswith("se.nr_migrations"):
                out["nr_migrations"] = int(line.split(":")[1])
    return out


def spawn_hog(cpu):
    """A child that spins forever on `cpu` (the contention for the worker)."""
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


class Workload:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, WORKLOAD], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.pid = self.proc.pid
        self.tid = None

    def start_thread(self):
        self.proc.stdin.write("thread\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().split()
        assert line[0] == "tid", line
        self.tid = int(line[1])
        self.wait_sleeping()
        return self.tid

    def send(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def call(self, cmd):
        self.send(cmd)
        reply = self.proc.stdout.readline().strip()
        self.wait_sleeping()
        return reply

    def wait_sleeping(self, timeout_s=10.0):
        """Until the worker is blocked in read() (state S): no switch is pending."""
        deadline = time.monotonic() + timeout_s
        path = f"/proc/{self.pid}/task/{self.tid}/stat"
        while time.monotonic() < deadline:
            with open(path) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state == "S":
                return
            time.sleep(0.001)
        raise TimeoutError("worker thread did not go to sleep")

    def close(self):
        try:
            self.send("exit")
            self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Window:
    t0_ns: int
    t1_ns: int
    before: dict
    after: dict
    reply: str

    def delta(self, key):
        return self.after[key] - self.before[key]


def window(work, cmd, sync, settle_s=0.0):
    """Run `cmd` with the worker bracketed by /proc reads and monotonic stamps.

    `sync()` makes the probe hand over everything it has; a final no-op wakes
    the worker so the last switch-out of the window is closed by a switch-in.
    `settle_s` keeps sampling backends' windows clear of the brackets."""
    time.sleep(settle_s)
    before = proc_counters(work.pid, work.tid)
    t0 = time.monotonic_ns()
    reply = work.call(cmd)
    after = proc_counters(work.pid, work.tid)
    t1 = time.monotonic_ns()
    time.sleep(settle_s)
    work.call("noop")
    time.sleep(settle_s)
    sync()
    return Window(t0, t1, before, after, reply)


def in_window(values, w):
    return (values >= w.t0_ns) & (values <= w.t1_ns)


def clipped_sum(start, end, w):
    lo = np.maximum(start, w.t0_ns)
    hi = np.minimum(end, w.t1_ns)
    return int(np.clip(hi - lo, 0, None).sum())
