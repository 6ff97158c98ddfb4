"""The placement probe's own cost: one poll of a traced process with N threads.

Starts a child process holding N sleeping threads (N in --threads, default
1,16,64,256), tracks it with a ProcPlacementProbe on this machine's /proc and
/sys (rows go to a sink that drops them), and times `poll()` (the per-second
work: /proc/stat, each thread's schedstat and stat, the static fields every
10 s) in --rounds rounds of --polls polls, arms interleaved. Prints the
median over rounds of the mean us per poll and what that is as a share of
one CPU at the default rate (placement_poll_ms = 1000). The probe runs on
its own idle-priority thread in the daemon; this is the CPU it takes.
Usage: python bench/placement_cost.py [--threads 1,16,64,256] [--rounds 7] [--polls 200]
"""

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import time

from stallscope.probes.base import ProbeSettings
from stallscope.probes.placement_proc import ProcPlacementProbe

CHILD = """
import sys, threading, time
ev = threading.Event()
for _ in range(int(sys.argv[1]) - 1):
    threading.Thread(target=ev.wait, daemon=True).start()
print("ready", flush=True)
time.sleep(3600)
"""


class DropSink:
    def append(self, table, columns):
        pass

    def loss(self, *a):
        pass

    def status(self, *a):
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,16,64,256")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--polls", type=int, default=200)
    args = ap.parse_args()
    counts = [int(x) for x in args.threads.split(",")]
    children, probes = {}, {}
    try:
        for n in counts:
            p = subprocess.Popen(
                [sys.executable, "-c", CHILD, str(n)], stdout=subprocess.PIPE, text=True
            )
            assert p.stdout.readline().strip() == "ready"
            children[n] = p
            probe = ProcPlacementProbe(ProbeSettings(placement_window_s=3600))
            probe._sink = DropSink()
            probe.track(p.pid)
            probe.settle()
            probes[n] = probe
        per = {n: [] for n in counts}
        for r in range(args.rounds):
            for n in counts:
                t0 = time.perf_counter_ns()
                for _ in range(args.polls):
                    probes[n].poll()
                per[n].append((time.perf_counter_ns() - t0) / args.polls / 1000)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        for p in children.values():
            p.send_signal(signal.SIGKILL)
            p.wait()
    print(f"placement probe poll cost ({platform.node()}, {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}, {args.rounds} rounds x {args.polls} polls)")  # fmt: skip
    print(f"{'threads':>8} {'us/poll':>9} {'CPU % at 1 Hz':>14}")
    for n in counts:
        us = statistics.median(per[n])
        print(f"{n:>8} {us:>9.1f} {us / 1e4:>14.4f}")


if __name__ == "__main__":
    main()
