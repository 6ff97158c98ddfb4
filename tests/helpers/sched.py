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


def _array(values):
    """numpy array of a column; nullable (pyarrow) columns become object
    arrays holding None, so a test can tell NULL from 0."""
    if hasattr(values, "to_pylist"):
        return np.array(values.to_pylist(), dtype=object)
    return np.asarray(values)


class CollectSink:
    """A Sink that keeps every batch, for tests."""

    def __init__(self):
        self.batches = {}
        self.losses = []
        self.statuses = []

    def append(self, table, columns):
        self.batches.setdefault(table, []).append({k: _array(v) for k, v in columns.items()})

    def loss(self, probe, start_ns, end_ns, count, reason):
        self.losses.append((probe, start_ns, end_ns, count, reason))

    def status(self, probe, backend, state, detail):
        self.statuses.append((probe, backend, state, detail))

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


def cpu_time_lost_ns(cpu):
    """irq + softirq + steal time of `cpu` from /proc/stat, ns (USER_HZ ticks).

    The kernel's per-thread runtime (schedstat) runs on rq_clock_task, which
    leaves out time spent in interrupts and time the hypervisor stole; a
    thread's on-CPU + off-CPU can fall short of wall time by that much."""
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                v = [int(x) for x in line.split()[1:]]
                return (v[5] + v[6] + v[7]) * tick_ns
    return 0


def spawn_hog(cpu):
    """A child that spins forever on `cpu` (the contention for the worker)."""
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


class Workload:
    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, WORKLOAD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
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

    def wait_sleeping(self, timeout_s=10.0, stable_s=0.02):
        """Until the worker is really off CPU, blocked in read().

        State S alone is not enough: a thread that has set S but not yet
        reached schedule() can still be preempted (a nonvoluntary switch)
        and switched back in. So wait for S with counters unchanged over
        `stable_s`, longer than a CPU hog's slice."""
        deadline = time.monotonic() + timeout_s
        base = f"/proc/{self.pid}/task/{self.tid}"

        def snapshot():
            with open(f"{base}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"{base}/schedstat") as f:
                sched = f.read()
            return state, sched

        last = None
        while time.monotonic() < deadline:
            cur = snapshot()
            if cur[0] == "S" and cur == last:
                return
            last = cur if cur[0] == "S" else None
            time.sleep(stable_s if last else 0.001)
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


def window(work, cmd, sync, boundary=None):
    """Run `cmd` with the worker bracketed by /proc reads and monotonic stamps.

    `sync()` makes the probe hand over everything it has; a final no-op wakes
    the worker so the last switch-out of the window is closed by a switch-in.
    `boundary()` (a sampling backend's take-a-sample-now) closes the probe's
    current window right before the first read and right after the last,
    while the worker sleeps in read(): the windows that overlap the bracket
    then hold exactly its events. (A fixed settle time did not: a poll late
    by more than it, under load, merged the no-op's switch into the
    bracket's last window, 25 voluntary switches against /proc's 24.)"""
    if boundary:
        boundary()
    before = proc_counters(work.pid, work.tid)
    before["lost_cpu1_ns"] = cpu_time_lost_ns(1)
    t0 = time.monotonic_ns()
    reply = work.call(cmd)
    after = proc_counters(work.pid, work.tid)
    after["lost_cpu1_ns"] = cpu_time_lost_ns(1)
    t1 = time.monotonic_ns()
    if boundary:
        boundary()
    work.call("noop")
    sync()
    return Window(t0, t1, before, after, reply)


def in_window(values, w):
    return (values >= w.t0_ns) & (values <= w.t1_ns)


def clipped_sum(start, end, w):
    lo = np.maximum(start, w.t0_ns)
    hi = np.minimum(end, w.t1_ns)
    return int(np.clip(hi - lo, 0, None).sum())


# -- checks shared by the event-exact backends (bcc, perf) ---------------------


def check_contended(probe, sink, work, sync, unseen=None):
    """Spinner sharing CPU 1 with a hog: counts, run-queue wait and wall time.

    `unseen()` (bcc) returns the (voluntary, preempted) switch-outs the
    probe has so far reported as lost for the worker: a switch the kernel
    dropped must be either recorded or reported, never silently missing."""
    work.call("pin 1")
    hog = spawn_hog(1)
    try:
        u0 = unseen() if unseen else (0, 0)
        w = window(work, "spin 400", sync)
        u1 = unseen() if unseen else (0, 0)
    finally:
        hog.kill()
        hog.wait()
    lost_vol, lost_inv = u1[0] - u0[0], u1[1] - u0[1]
    off = sink.table("offcpu", work.tid)
    started = in_window(off["start_ns"], w)
    preempted = int((off["preempted"] & started).sum())
    voluntary = int((~off["preempted"] & started).sum())
    assert w.delta("nonvoluntary") >= 5, "the hog did not preempt the worker"
    # what the kernel drops is reported, and stays rare
    assert lost_inv + lost_vol <= 0.1 * (w.delta("nonvoluntary") + w.delta("voluntary"))
    assert abs(preempted + lost_inv - w.delta("nonvoluntary")) <= 0.01 * w.delta("nonvoluntary")
    assert abs(voluntary + lost_vol - w.delta("voluntary")) <= 0.01 * w.delta("voluntary")

    rq = sink.table("runq", work.tid)
    ended = in_window(rq["end_ns"], w)
    wait_ns = int((rq["end_ns"][ended] - rq["start_ns"][ended]).sum())
    assert w.delta("wait_ns") > 0
    lost = lost_inv + lost_vol
    # a lost interval takes its wait with it: then the total can only be short
    assert wait_ns <= 1.05 * w.delta("wait_ns")
    if not lost:
        assert wait_ns >= 0.95 * w.delta("wait_ns")

    wall_ns = w.t1_ns - w.t0_ns
    on_plus_off = w.delta("run_ns") + clipped_sum(off["start_ns"], off["end_ns"], w)
    # irq/steal time on the worker's CPU is missing from its runtime; /proc/stat
    # counts it in ticks, so allow one tick more whenever there was any
    lost_ns = w.delta("lost_cpu1_ns")
    allowance_ns = lost_ns + (1_000_000_000 // os.sysconf("SC_CLK_TCK") if lost_ns else 0)
    assert on_plus_off <= wall_ns * 1.01
    if not lost:
        assert on_plus_off >= wall_ns * 0.99 - allowance_ns, (on_plus_off, wall_ns, lost_ns)
    assert np.all(off["end_ns"] >= off["start_ns"])
    assert np.all(rq["end_ns"] >= rq["start_ns"])
    if not unseen:
        assert not sink.losses
    return w


def check_flips(probe, sink, work, sync, n_flips=20):
    work.call("pin 0")
    w = window(work, f"flip {n_flips}", sync)
    mig = sink.table("migrations", work.tid)
    sel = in_window(mig["ts_ns"], w)
    assert int(sel.sum()) == n_flips == w.delta("nr_migrations")
    assert np.all(mig["from_cpu"][sel] != mig["to_cpu"][sel])
    # pinned to 0 first, so the flips go 0->1, 1->0, ...
    assert list(mig["to_cpu"][sel]) == [(i + 1) % 2 for i in range(n_flips)]
    return w


def check_markers(probe, sink, work, sync, n_marks=20, unseen=None):
    """Clock alignment: kernel timestamps and time.monotonic_ns are one clock.

    `unseen()` as for check_contended: a sleep whose switch the kernel did
    not report to the probe (it skips a program's run while another BPF
    program is active on that CPU, as under concurrent tracing) has no row,
    but a reported loss; every other sleep has its row inside its markers."""
    work.call("pin 0")
    u0 = unseen() if unseen else (0, 0)
    w = window(work, f"marks {n_marks}", sync)
    u1 = unseen() if unseen else (0, 0)
    marks = json.loads(w.reply)
    assert len(marks) == 2 * n_marks
    off = sink.table("offcpu", work.tid)
    mig = sink.table("migrations", work.tid)
    missing_sleeps = []
    for kind, t0, t1 in marks:
        if kind == "sleep":
            inside = (off["start_ns"] >= t0) & (off["end_ns"] <= t1) & ~off["preempted"]
            if not inside.any():
                missing_sleeps.append((t0, t1))
        else:
            inside = (mig["ts_ns"] >= t0) & (mig["ts_ns"] <= t1)
            assert inside.any(), f"no {kind} event inside its markers [{t0}, {t1}]"
    lost_vol = u1[0] - u0[0]
    assert len(missing_sleeps) <= lost_vol, (
        f"no sleep inside its markers {missing_sleeps[:3]}, {lost_vol} switches reported lost"
    )


def check_untrack(probe, sink, sync):
    w = Workload()
    try:
        w.start_thread()
        w.call("pin 0")
        window(w, "flip 4", sync)
        assert not len(sink.table("migrations", w.tid).get("tid", []))
        assert not len(sink.table("offcpu", w.tid).get("tid", []))
        probe.track(w.pid)
        window(w, "flip 4", sync)
        assert len(sink.table("migrations", w.tid)["tid"]) == 4
        probe.untrack(w.pid)
        window(w, "flip 4", sync)
        assert len(sink.table("migrations", w.tid)["tid"]) == 4
    finally:
        w.close()


FIFO_CODE = """
import ctypes, os, sys, time
ctypes.CDLL(None).prctl(15, b"stall-fifo", 0, 0, 0)
os.sched_setaffinity(0, {%(cpu)d})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
print("ready", flush=True)
sys.stdin.readline()
for _ in range(%(bursts)d):
    time.sleep(0.010)
    end = time.monotonic() + 0.002
    while time.monotonic() < end:
        pass
print("done", flush=True)
"""


def spawn_fifo(cpu, bursts=20):
    """A SCHED_FIFO process named stall-fifo pinned to `cpu`: once told to go
    (a line on stdin) it wakes every 10 ms and spins 2 ms, `bursts` times,
    preempting whatever ordinary task runs on that CPU."""
    proc = subprocess.Popen(
        [sys.executable, "-c", FIFO_CODE % {"cpu": cpu, "bursts": bursts}],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc
