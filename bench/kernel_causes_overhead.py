"""Benchmark: what the kernel-cause probes cost processes they do not trace, and their row rates.

Parts, each measured in interleaved rounds so every mode has a fresh
baseline next to it (medians reported):

  syscalls   getppid() through ctypes in this (untraced) process: no program,
             syscall program loaded but detached, attached
  faults     first-touch 4 KiB page faults in this (untraced) process: no
             program; page-fault program loaded, timing to the mapping (the
             default) and to the next fault (page_fault_map_end = false)
  programs   the kernel's own per-run cost of each program (bpf_stats) while
             loopback datagrams (softirqs), wakeups and faults run untraced
  rows       rows per second the syscall probe stores for a traced process
             making 50,000 syscalls/s (one syscall; four different ones)

Needs root and bcc. Usage: python bench/kernel_causes_overhead.py [--rounds N]
"""

import argparse
import ctypes
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "daemon"))

from stallscope.probes.base import ProbeSettings
from stallscope.probes.bpf_common import program_stats
from stallscope.probes.faults_bcc import BccFaultsProbe, first_touch_cost
from stallscope.probes.irq_bcc import BccIrqProbe
from stallscope.probes.sched_bcc import BccSchedProbe
from stallscope.probes.syscalls_bcc import BccSyscallsProbe

libc = ctypes.CDLL(None)


class CountSink:
    def __init__(self):
        self.rows = {}
        self.losses = 0

    def append(self, table, columns):
        self.rows[table] = self.rows.get(table, 0) + len(next(iter(columns.values())))
        if table == "syscalls":  # rows of one call at or over the threshold
            long_calls = (columns["count"] == 1) & (columns["total_ns"] >= self.threshold_ns)
            self.rows["syscalls_long"] = self.rows.get("syscalls_long", 0) + int(long_calls.sum())

    threshold_ns = 50_000

    def loss(self, probe, start_ns, end_ns, count, reason):
        self.losses += count


def getppid_ns(n=200_000):
    f = libc.getppid
    t0 = time.perf_counter_ns()
    for _ in range(n):
        f()
    return (time.perf_counter_ns() - t0) / n


def fault_ns(pages=2048):
    """Wall ns per first-touch fault (write of fresh pages, not net of the write)."""
    cost, faults = first_touch_cost(pages)
    return cost


def sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])


def paired(modes, measure, rounds):
    """{mode: median} with each round measuring every mode in turn."""
    got = {m: [] for m in modes}
    for _ in range(rounds):
        for mode, enter, leave in modes.values():
            enter()
            try:
                got[mode].append(measure())
            finally:
                leave()
    return {m: statistics.median(v) for m, v in got.items()}


def bench_syscalls(rounds):
    other = sleeper()
    sc = BccSyscallsProbe()
    sc.start(CountSink())
    sc.track(other.pid)
    nop = lambda: None  # noqa: E731
    try:
        modes = {
            "loaded, detached": ("loaded, detached", nop, nop),
            "attached": ("attached", sc.attach, sc.detach),
        }
        # "none" needs the program unloaded: measure it before and after
        before = [getppid_ns() for _ in range(rounds)]
        res = paired(modes, getppid_ns, rounds)
    finally:
        sc.stop()
        other.kill()
    after = [getppid_ns() for _ in range(rounds)]
    res["none"] = statistics.median(before + after)
    return res


def bench_faults(rounds):
    """First-touch fault ns: no program, and the page-fault program loaded for
    another process, timing to the mapping (`page_fault_map_end`, the default)
    or to the next fault; each round loads one arm, measures, unloads it, then
    the other, so only one program is attached at a time."""
    arms = {
        "loaded (untracked), to the mapping": True,
        "loaded (untracked), to the next fault": False,
    }
    none = [fault_ns() for _ in range(rounds)]
    got = {name: [] for name in arms}
    other = sleeper()
    try:
        for _ in range(rounds):
            for name, map_end in arms.items():
                p = BccFaultsProbe(ProbeSettings(page_fault_map_end=map_end))
                p.start(CountSink())
                try:
                    p.track(other.pid)
                    got[name].append(fault_ns())
                finally:
                    p.stop()
    finally:
        other.kill()
    none += [fault_ns() for _ in range(rounds)]
    out = {"none": statistics.median(none)}
    out.update({name: statistics.median(v) for name, v in got.items()})
    return out


def udp_flood(seconds):
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        tx.sendto(b"x" * 256, rx.getsockname())
        n += 1
        if n % 64 == 0:
            try:
                while True:
                    rx.recv(512)
            except BlockingIOError:
                pass
    return n


def bench_programs(seconds):
    """Per-run ns of every program, from the kernel's bpf_stats."""
    path = "/proc/sys/kernel/bpf_stats_enabled"
    with open(path) as f:
        was = f.read().strip()
    other = sleeper()
    probes = [BccSchedProbe(), BccIrqProbe(), BccFaultsProbe(), BccSyscallsProbe()]
    for p in probes:
        p.start(CountSink())
        p.track(other.pid)
    probes[-1].attach()
    try:
        with open(path, "w") as f:
            f.write("1")
        stop = threading.Event()

        def waker():  # wakeups (sched_waking) and switches, untracked
            r, w = os.pipe()
            t = threading.Thread(target=lambda: [os.read(r, 1) for _ in iter(int, 1)], daemon=True)
            t.start()
            while not stop.is_set():
                os.write(w, b"x")
                time.sleep(0.0002)

        threading.Thread(target=waker, daemon=True).start()
        udp_flood(seconds)
        for _ in range(20):
            fault_ns(512)
        stop.set()
        out = {}
        for p in probes:
            for name, st in program_stats(p._bpf).items():
                if st.get("run_cnt"):
                    out[f"{p.name}:{name}"] = {
                        "runs": st["run_cnt"],
                        "ns_per_run": round(st["run_time_ns"] / st["run_cnt"], 1),
                    }
        return out
    finally:
        with open(path, "w") as f:
            f.write(was)
        for p in probes:
            p.stop()
        other.kill()


ENGINE = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None)
calls = [libc.getppid, libc.getpid, libc.getuid, libc.getgid][: int(sys.argv[1])]
rate, seconds = 50_000, float(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
t0 = time.monotonic(); n = 0
while (now := time.monotonic()) - t0 < seconds:
    due = int((now - t0) * rate)
    while n < due:
        calls[n % len(calls)](); n += 1
    time.sleep(0.0005)
print(n / seconds, flush=True)
"""


def bench_rows(kinds, seconds=3.0):
    sink = CountSink()
    p = BccSyscallsProbe()
    p.start(sink)
    eng = subprocess.Popen(
        [sys.executable, "-c", ENGINE, str(kinds), str(seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert eng.stdout.readline().strip() == "ready"
        p.track(eng.pid)
        p.attach()
        eng.stdin.write("go\n")
        eng.stdin.flush()
        rate = float(eng.stdout.readline())
        eng.wait()
        p.detach()
    finally:
        p.stop()
    rows = sink.rows.get("syscalls", 0)
    long_rows = sink.rows.get("syscalls_long", 0)
    return {
        "syscalls_per_s": round(rate),
        "rows_per_s": round(rows / seconds, 1),
        "of_which_single_calls_over_threshold_per_s": round(long_rows / seconds, 1),
        "summed_rows_per_s": round((rows - long_rows) / seconds, 1),
        "lost": sink.losses,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    out = {
        "host": os.uname().release,
        "cpus": os.cpu_count(),
        "load_avg_before": os.getloadavg(),
        "getppid_ns": bench_syscalls(args.rounds),
        "first_touch_fault_ns": bench_faults(args.rounds),
        "program_ns_per_run": bench_programs(args.seconds),
        "rows_at_50k_syscalls_per_s": {
            "one syscall": bench_rows(1, args.seconds),
            "four syscalls": bench_rows(4, args.seconds),
        },
        "load_avg_after": os.getloadavg(),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
