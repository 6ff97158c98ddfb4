"""Benchmark: what telling a yield from a preemption costs the sched probe.

`offcpu.yielded` comes from reading the system call a thread is in (its saved
registers, bpf_task_pt_regs) in the `sched_switch` program at each preempted
switch-out of a tracked thread (sched_bcc.c, in_yield). This bench loads the
probe twice, with sched_yield's number compiled in (as the daemon does) and
without it (the program then reads nothing), round by round, while a tracked
process on one CPU alternates ~2 ms of computing with 10 sched_yield() calls
beside a hog pinned to the same CPU: most of its switch-outs are preempted ones, the
case that pays. Reported per mode (medians of the rounds): the program's ns
per run (kernel.bpf_stats_enabled, restored at the end), preempted
switch-outs a second, and the extra ns per preempted switch-out, (ns per
run with - without) x runs / preempted switch-outs. Also the yielder's
yields per second of wall time, the engine-side view. Needs root and bcc.

Usage: python bench/yield_cost.py [--rounds 6] [--seconds 5]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

from stallscope.probes import sched_bcc
from stallscope.probes.sched_bcc import BccSchedProbe

CPU = 1
YIELDER = f"""
import os, sys, time
os.sched_setaffinity(0, {{{CPU}}})
sys.stdin.readline()
end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    t0 = time.monotonic_ns()
    while time.monotonic_ns() - t0 < 2_000_000:
        pass
    for _ in range(10):
        os.sched_yield()
    n += 10
print(n, flush=True)
"""


class CountSink:
    def __init__(self):
        self.preempted = self.yielded = 0

    def append(self, table, columns):
        if table == "offcpu":
            self.preempted += int(columns["preempted"].sum())
            if "yielded" in columns:
                self.yielded += int(columns["yielded"].sum())

    def loss(self, *args):
        pass

    def status(self, *args):
        pass


def one(with_yields, seconds):
    real = sched_bcc.yield_cflags
    if not with_yields:
        sched_bcc.yield_cflags = lambda: []
    probe = BccSchedProbe()
    sink = CountSink()
    try:
        probe.start(sink)
    finally:
        sched_bcc.yield_cflags = real
    hog = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{CPU}}})\nwhile True: pass"]
    )
    y = subprocess.Popen(
        [sys.executable, "-c", YIELDER, str(seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        probe.track(y.pid)
        time.sleep(0.2)
        before = probe.program_stats().get("sched_switch", {})
        y.stdin.write("go\n")
        y.stdin.flush()
        yields = int(y.stdout.readline())
        y.wait()
        after = probe.program_stats().get("sched_switch", {})
        probe.drain()
    finally:
        hog.kill()
        hog.wait()
        probe.stop()
    runs = after.get("run_cnt", 0) - before.get("run_cnt", 0)
    ns = after.get("run_time_ns", 0) - before.get("run_time_ns", 0)
    return {
        "ns_per_run": ns / max(runs, 1),
        "runs_per_s": runs / seconds,
        "preempted_per_s": sink.preempted / seconds,
        "yielded_per_s": sink.yielded / seconds,
        "yields_per_s": yields / seconds,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("yield_cost: needs root (bcc)")
    if not sched_bcc.yield_cflags():
        sys.exit(f"yield_cost: sched_yield's number is not known on {os.uname().machine}")
    was = open("/proc/sys/kernel/bpf_stats_enabled").read().strip()
    subprocess.run(["sysctl", "-q", "kernel.bpf_stats_enabled=1"], check=True)
    res = {True: [], False: []}
    try:
        for k in range(a.rounds):
            for mode in (True, False) if k % 2 == 0 else (False, True):
                r = one(mode, a.seconds)
                res[mode].append(r)
                name = "yields" if mode else "no-yields"
                print(f"round {k + 1} {name:9s} " + " ".join(f"{x} {v:.1f}" for x, v in r.items()))
    finally:
        subprocess.run(["sysctl", "-q", f"kernel.bpf_stats_enabled={was}"], check=True)
    med = {m: {x: statistics.median(r[x] for r in rs) for x in rs[0]} for m, rs in res.items()}
    for m in (False, True):
        name = "yields" if m else "no-yields"
        print(f"median {name:9s} " + " ".join(f"{x} {v:.1f}" for x, v in med[m].items()))
    w, wo = med[True], med[False]
    extra = (w["ns_per_run"] - wo["ns_per_run"]) * w["runs_per_s"] / max(w["preempted_per_s"], 1)
    print(
        f"extra per preempted switch-out: {extra:.0f} ns; yields a second "
        f"{w['yields_per_s']:.0f} with, {wo['yields_per_s']:.0f} without "
        f"(ratio {w['yields_per_s'] / max(wo['yields_per_s'], 1):.3f})"
    )


if __name__ == "__main__":
    main()
