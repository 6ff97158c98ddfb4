"""Benchmark: how often the daemon preempts a busy engine it cannot dodge, and for how long.

The case of issue 23 that moving the daemon cannot solve: the engine's step
thread unpinned at RATE steps/s (tests/helpers/observer_engine.py: 4 spans
a step, STEP_MS of pure-Python work), a sibling thread keeping the other
CPU busy (hashing, GIL released), so that on a 2-CPU machine every CPU is
taken. Rounds alternate a baseline (the same engine with no daemon: its
probe has no socket to reach) and a traced run (a real daemon, bcc
scheduling probe and the default probes, as root). Per round:

  involuntary  the step thread's nonvoluntary_ctxt_switches over its window
               (the kernel's counter, /proc), per 10,000 steps
  by_daemon    preemptions of the step thread whose next task was a daemon
               thread (offcpu rows, preemptor_pid = the daemon), per 10,000
               steps, their total ms and the split by daemon thread
  wakeups      each daemon thread's voluntary switches per second over the
               traced run's middle (a thread that sleeps and wakes often is
               a thread that can be picked on busy CPUs)

`--gap-clock both` runs the traced engine twice a round, with the daemon's
gap clock (stallscope/gaps.py) on and off, alternating which goes first,
against the round's one baseline. The medians of the rounds are printed
(per arm), then one JSON line. Never asserts
(timing belongs here, not in tests: tests/store/test_observer.py holds the
pinned case to its bound).

Usage (as root): python bench/daemon_preemption.py --rounds 2 --seconds 30 [--gap-clock both]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "daemon"), str(ROOT)]

from helpers.daemonproc import DaemonProcess  # noqa: E402
from helpers.tasks import task_field  # noqa: E402

ENGINE = str(ROOT / "tests" / "helpers" / "observer_engine.py")


def run_engine(sock, seconds, rate, step_ms):
    out = subprocess.run(
        [sys.executable, ENGINE, sock, str(seconds), str(rate), str(step_ms), "-", "busy"],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def thread_switches(pid):
    """{tid: (comm, voluntary switches)} of every thread of `pid`."""
    return task_field(pid, "status", "voluntary_ctxt_switches", int)


def traced_round(seconds, rate, step_ms):
    tmp = Path(tempfile.mkdtemp(prefix="stallscope-preempt-"))
    d = DaemonProcess(tmp, sched_backend="bcc").start(timeout_s=90)
    wakeups = {}
    try:
        result = {}
        worker = threading.Thread(
            target=lambda: result.update(run_engine(d.socket, seconds, rate, step_ms))
        )
        worker.start()
        time.sleep(seconds * 0.2)
        a, t0 = thread_switches(d.proc.pid), time.monotonic()
        time.sleep(seconds * 0.6)
        b, dt = thread_switches(d.proc.pid), time.monotonic() - t0
        worker.join()
        for tid, (comm, vol) in b.items():
            if tid in a:
                wakeups[comm] = wakeups.get(comm, 0.0) + (vol - a[tid][1]) / dt
    finally:
        d.stop()
    lo, hi = result["window_ns"]
    rows = d.query(
        "SELECT preemptor_comm, count(*), sum(end_ns - start_ns) FROM offcpu WHERE tid = ? "
        "AND preempted AND preemptor_pid = ? AND start_ns >= ? AND start_ns < ? GROUP BY ALL "
        "ORDER BY 2 DESC",
        [result["tid"], d.proc.pid, lo, hi],
    )
    spans = d.scalar("SELECT count(*) FROM spans")
    return result, rows, spans, wakeups


def per_10k(n, steps):
    return round(n * 10_000 / max(1, steps), 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=200.0, help="steps per second")
    ap.add_argument("--step-ms", type=float, default=2.5, help="work per step, ms")
    ap.add_argument(
        "--gap-clock",
        choices=("default", "on", "off", "both"),
        default="default",
        help="the daemon's sched_gap_clock: as configured, on, off, or both in each round "
        "(alternating which goes first)",
    )
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("daemon_preemption: needs root (the bcc scheduling probe)")
    arms = ["on", "off"] if args.gap_clock == "both" else [args.gap_clock]
    rounds = []
    for k in range(args.rounds):
        print(f"round {k + 1}/{args.rounds}: baseline, then traced", file=sys.stderr, flush=True)
        base = run_engine("/nonexistent/stallscope.sock", args.seconds, args.rate, args.step_ms)
        for arm in arms if k % 2 == 0 else arms[::-1]:
            rounds.append(traced_arm(args, arm, base))
            print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    keys = ("baseline_involuntary_per_10k", "traced_involuntary_per_10k", "by_daemon_per_10k",
            "by_daemon_ms")  # fmt: skip
    out = {"seconds": args.seconds, "rate": args.rate, "step_ms": args.step_ms}
    for arm in arms:
        mine = [r for r in rounds if r["gap_clock"] == arm]
        medians = {k: statistics.median(r[k] for r in mine) for k in keys}
        for k in keys:
            print(f"{arm:7s} {k:32s} median {medians[k]:8.1f}   rounds {[r[k] for r in mine]}")
        out[arm] = {"medians": medians, "rounds": mine}
    if len(arms) == 1:
        out.update(out.pop(arms[0]))
    print(json.dumps(out))


def traced_arm(args, arm, base):
    """One traced run with the gap clock as `arm` says, against `base`."""
    if arm == "default":
        os.environ.pop("STALLSCOPE_SCHED_GAP_CLOCK", None)
    else:
        os.environ["STALLSCOPE_SCHED_GAP_CLOCK"] = "true" if arm == "on" else "false"
    traced, rows, spans, wakeups = traced_round(args.seconds, args.rate, args.step_ms)
    return {
        "gap_clock": arm,
        "baseline_involuntary_per_10k": per_10k(base["nonvoluntary"], base["steps"]),
        "traced_involuntary_per_10k": per_10k(traced["nonvoluntary"], traced["steps"]),
        "by_daemon_per_10k": per_10k(sum(r[1] for r in rows), traced["steps"]),
        "by_daemon_ms": round(sum(r[2] for r in rows) / 1e6, 1),
        "by_thread": {c: [n, round(ns / 1e6, 1)] for c, n, ns in rows},
        "spans_stored": spans,
        "spans_made": 4 * traced["steps"],
        "daemon_wakeups_per_s": {c: round(v, 1) for c, v in sorted(wakeups.items())},
    }


if __name__ == "__main__":
    main()
