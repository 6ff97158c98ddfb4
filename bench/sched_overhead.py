"""Benchmark: what the sched probes cost a context switch, and how fast the bcc reader drains.

Runs `pingpong.c` (two processes pinned to one CPU passing a byte through
pipes: two switches and two wakeups per round trip) under each mode, in
rounds so that every mode is measured side by side with a fresh baseline:

  none            no probe loaded
  bcc-untracked   bcc probe loaded, tracking another (sleeping) process
  bcc-tracked     bcc probe tracking both ping-pong processes
  perf-untracked  perf probe following another process
  perf-tracked    perf probe following both ping-pong processes

and reports the median time per switch and the difference to `none`. The
bcc-tracked runs also give the reader's CPU time per record; a last part
decodes synthetic records to give the reader's ceiling on one core. Needs
root, bcc and gcc. Usage: python bench/sched_overhead.py [--rounds N] [--repeats R]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from stallscope.probes.sched_bcc import BccSchedProbe
from stallscope.probes.sched_perf import PerfSchedProbe

HERE = os.path.dirname(os.path.abspath(__file__))


class CountSink:
    def __init__(self):
        self.rows = 0
        self.losses = 0

    def append(self, table, columns):
        self.rows += len(next(iter(columns.values())))

    def loss(self, probe, start_ns, end_ns, count, reason):
        self.losses += count


def build_pingpong(tmp):
    exe = os.path.join(tmp, "pingpong")
    subprocess.run(["gcc", "-O2", "-o", exe, os.path.join(HERE, "pingpong.c")], check=True)
    return exe


def run_pingpong(exe, rounds, cpu, on_ready=None):
    p = subprocess.Popen(
        [exe, str(rounds), str(cpu)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    _, a, b = p.stdout.readline().split()
    if on_ready:
        on_ready(int(a), int(b))
    p.stdin.write("x")
    p.stdin.flush()
    line = p.stdout.readline().split()
    p.wait()
    return float(line[1]) / 2.0  # ns per switch (each with its wakeup)


def decode_ceiling(n=1_000_000):
    """Reader decode cost per record, synthetic switch-in records, no kernel
    events (the program is loaded only for its record layout)."""
    p = BccSchedProbe()
    p.start(CountSink())
    dtype = p._ring.dtype  # the compiled layout (sched_bcc.h), with the ring header
    p.stop()
    recs = np.zeros(n, dtype=dtype)
    recs["kind"] = 1
    recs["a_ns"] = np.arange(n) + 1
    recs["b_ns"] = np.where(np.arange(n) % 2 == 0, np.arange(n) + 1, 0)
    recs["c_ns"] = np.arange(n) + 10
    p._sink = CountSink()
    batch = 4096  # about one 20 ms poll at 200k/s
    t0 = time.thread_time_ns()
    for i in range(0, n, batch):
        p._emit(recs[i : i + batch].copy())
    return (time.thread_time_ns() - t0) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=0)
    args = ap.parse_args()

    perf_reason = PerfSchedProbe.unavailable()
    if perf_reason:
        print(f"perf modes skipped: {perf_reason}")
    stats_path = "/proc/sys/kernel/bpf_stats_enabled"
    with open(stats_path) as f:
        stats_was = f.read().strip()
    prog = {}
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    results = {
        m: [] for m in ("none", "bcc-untracked", "bcc-tracked", "perf-untracked", "perf-tracked")
    }
    deltas = {m: [] for m in results if m != "none"}
    reader = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            exe = build_pingpong(tmp)
            run_pingpong(exe, args.rounds // 10, args.cpu)  # warm up
            for _ in range(args.repeats):
                base = run_pingpong(exe, args.rounds, args.cpu)
                results["none"].append(base)

                sink = CountSink()
                probe = BccSchedProbe()
                probe.start(sink)
                probe.track(sleeper.pid)
                v = run_pingpong(exe, args.rounds, args.cpu)
                results["bcc-untracked"].append(v)
                deltas["bcc-untracked"].append(v - base)
                cpu0 = probe.status()["reader_cpu_ns"]
                rec0 = probe.status()["records"]
                t0 = time.monotonic_ns()
                v = run_pingpong(
                    exe,
                    args.rounds,
                    args.cpu,
                    lambda a, b, probe=probe: (probe.track(a), probe.track(b)),
                )
                probe.drain()
                wall = time.monotonic_ns() - t0
                st = probe.status()
                results["bcc-tracked"].append(v)
                deltas["bcc-tracked"].append(v - base)
                reader.append(
                    ((st["reader_cpu_ns"] - cpu0), st["records"] - rec0, wall, sink.losses)
                )
                probe.stop()

                # in-kernel cost per program run, from the kernel's own stats
                # (bpf_stats_enabled adds two clock reads per run, so this is
                # measured in a separate untracked run and is an upper bound)
                with open(stats_path, "w") as f:
                    f.write("1")
                try:
                    for label, hook in (
                        ("untracked", None),
                        ("tracked", lambda a, b, p=None: None),
                    ):
                        probe = BccSchedProbe()
                        probe.start(CountSink())
                        probe.track(sleeper.pid)
                        on_ready = None
                        if hook is not None:
                            on_ready = (lambda pr: lambda a, b: (pr.track(a), pr.track(b)))(probe)
                        run_pingpong(exe, args.rounds, args.cpu, on_ready)
                        for name, st in probe.program_stats().items():
                            acc = prog.setdefault((label, name), [0, 0])
                            acc[0] += st.get("run_time_ns", 0)
                            acc[1] += st.get("run_cnt", 0)
                        probe.stop()
                finally:
                    with open(stats_path, "w") as f:
                        f.write(stats_was)

                if perf_reason:
                    continue
                sink = CountSink()
                probe = PerfSchedProbe()
                probe.start(sink)
                probe.track(sleeper.pid)
                v = run_pingpong(exe, args.rounds, args.cpu)
                results["perf-untracked"].append(v)
                deltas["perf-untracked"].append(v - base)
                v = run_pingpong(
                    exe,
                    args.rounds,
                    args.cpu,
                    lambda a, b, probe=probe: (probe.track(a), probe.track(b)),
                )
                results["perf-tracked"].append(v)
                deltas["perf-tracked"].append(v - base)
                probe.stop()
    finally:
        sleeper.kill()
        sleeper.wait()

    base = statistics.median(results["none"])
    print(
        f"pipe ping-pong, {args.rounds} round trips x {args.repeats} repeats, "
        f"CPU {args.cpu}, {os.cpu_count()} CPUs, kernel {os.uname().release}"
    )
    print(f"{'mode':16} {'ns/switch':>10} {'vs none':>9} {'+ns/switch (paired)':>20}")
    for mode, vals in results.items():
        if not vals:
            continue
        med = statistics.median(vals)
        d = statistics.median(deltas[mode]) if mode in deltas else 0.0
        spread = (
            f"  paired deltas min..max {min(deltas[mode]):.0f}..{max(deltas[mode]):.0f}"
            if mode in deltas
            else ""
        )
        print(f"{mode:16} {med:10.0f} {med / base:9.3f} {d:20.0f}{spread}")
    cpu_ns = sum(r[0] for r in reader)
    recs = sum(r[1] for r in reader)
    wall = sum(r[2] for r in reader)
    print(
        f"bcc reader during bcc-tracked: {recs} records, {recs / wall * 1e9:,.0f} records/s, "
        f"{cpu_ns / max(recs, 1):.0f} ns CPU/record, reader CPU share "
        f"{cpu_ns / wall * 100:.1f}% of one core, losses {sum(r[3] for r in reader)}"
    )
    for (label, name), (t, n) in sorted(prog.items()):
        if n and name in ("sched_switch", "sched_wakeup", "sched_migrate_task"):
            print(
                f"bpf program {name:18} ping-pong {label:9}: {n:8d} runs, "
                f"{t / n:4.0f} ns per run (kernel bpf_stats; all switches of the host)"
            )
    per = decode_ceiling()
    print(
        f"bcc reader decode ceiling (synthetic, 4096-record batches): {per:.0f} ns/record "
        f"= {1e9 / per:,.0f} records/s on one core"
    )


if __name__ == "__main__":
    main()
