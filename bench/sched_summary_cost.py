"""Benchmark: rows and daemon CPU tracing a torch engine, every thread exact vs workers summarised.

Runs the real transformers continuous-batching engine
(stallscope/demo/transformers_engine.py, torch CPU with an OpenMP pool of
`--torch-threads`) under `stallscope run --preset transformers` against a
root daemon with the bcc scheduling probe and the default kernel-cause
probes, in two modes, alternated round by round (which goes first swaps
each round) so both see the same machine:

  detail    --sched-detail: a row per switch for every thread (before)
  summary   default: threads without spans summarised in the kernel (after)

For each run: the sched rows the engine's process got per second of its
life (offcpu + runq + migrations, and sched_summary), and the daemon's CPU
(utime + stime from /proc) from the engine's start to its exit, per second
of engine wall time (the BPF compile at daemon start is left out). Prints
every run and the medians with the ratio. Needs root, bcc and the engines
extra (`--engine worker`: a torch-free stand-in whose pool worker switches
~5,000 times a second, the rate issue 12 measured on a torch OpenMP
worker). Usage: python bench/sched_summary_cost.py [--rounds N]
[--serve-seconds S] [--engine transformers|worker]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stallscope import demo
from stallscope.demo.child import DaemonChild

ENGINE = str(Path(demo.__file__).resolve().parent / "transformers_engine.py")
TICK = os.sysconf("SC_CLK_TCK")
# --engine worker: a stand-in for an OpenMP pool at the rate, with no
# torch: steps on the main thread (200 us of Python, 1 ms sleep) while a
# worker that never emits a span sleeps 100 us at a time (thousands of
# switches a second).
WORKER_ENGINE = """
import sys, threading, time
import probe_client
probe = probe_client.connect(socket_path=sys.argv[1], run_label="worker-bench")
stop = threading.Event()
def worker():
    while not stop.is_set():
        time.sleep(0.0001)
t = threading.Thread(target=worker)
t.start()
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    t0 = probe.begin()
    sum(range(3000))
    time.sleep(0.001)
    probe.end("step", t0, batch=1)
stop.set()
t.join()
probe.close()
"""


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def one_run(mode, args, tmp):
    folder = Path(tempfile.mkdtemp(dir=tmp))
    extra = ["--sched-backend", "bcc", "--gpu-backend", "none"]
    if mode == "detail":
        extra.append("--sched-detail")
    if not args.kernel_causes:
        extra.append("--no-kernel-causes")
    daemon = DaemonChild(folder / "p.sock", folder / "d.duckdb", folder / "d.log", extra).start(
        timeout_s=120
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        cpu0, t0 = cpu_s(daemon.proc.pid), time.monotonic()
        if args.engine == "worker":
            command = [sys.executable, "-c", WORKER_ENGINE, daemon.socket, str(args.serve_seconds)]
        else:
            command = [sys.executable, "-m", "stallscope.cli", "run", "--socket", daemon.socket,
                       "--preset", "transformers", "--", sys.executable, ENGINE,
                       "--serve-seconds", str(args.serve_seconds), "--rate", str(args.rate),
                       "--torch-threads", str(args.torch_threads)]  # fmt: skip
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, timeout=900)
        wall = time.monotonic() - t0
        cpu = cpu_s(daemon.proc.pid) - cpu0
    finally:
        daemon.stop(timeout_s=60)
    q = daemon.query
    (pid,) = q("SELECT pid FROM runs ORDER BY run_id LIMIT 1")[0]
    exact = sum(q(f"SELECT count(*) FROM {t} WHERE pid = ?", [pid])[0][0]
                for t in ("offcpu", "runq", "migrations"))  # fmt: skip
    summary = q("SELECT count(*) FROM sched_summary WHERE pid = ?", [pid])[0][0]
    steps = q("SELECT count(*) FROM spans WHERE kind = 'step'")[0][0]
    return {"mode": mode, "wall_s": wall, "cpu_pct": 100 * cpu / wall,
            "exact_per_s": exact / wall, "summary_per_s": summary / wall,
            "rows_per_s": (exact + summary) / wall, "steps": steps,
            "rows_per_step": (exact + summary) / max(steps, 1)}  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve-seconds", type=float, default=20)
    parser.add_argument("--rate", type=float, default=10)
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument("--engine", choices=("transformers", "worker"), default="transformers")
    parser.add_argument(
        "--kernel-causes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the daemon's default kernel-cause probes (page faults, IRQ, steal)",
    )
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            modes = ("detail", "summary") if r % 2 == 0 else ("summary", "detail")
            for mode in modes:
                run = one_run(mode, args, tmp)
                runs.append(run)
                print(
                    f"round {r + 1} {mode:8} wall {run['wall_s']:5.1f} s  daemon CPU "
                    f"{run['cpu_pct']:5.1f}%  sched rows/s {run['rows_per_s']:8.0f} (exact "
                    f"{run['exact_per_s']:.0f}, summary {run['summary_per_s']:.0f})  "
                    f"steps {run['steps']}, rows/step {run['rows_per_step']:.1f}",
                    flush=True,
                )
    med = {
        mode: {k: statistics.median(r[k] for r in runs if r["mode"] == mode)
               for k in ("cpu_pct", "rows_per_s", "exact_per_s", "summary_per_s", "wall_s",
                         "rows_per_step")}
        for mode in ("detail", "summary")
    }  # fmt: skip
    for mode, m in med.items():
        print(
            f"median {mode:8} daemon CPU {m['cpu_pct']:.1f}% of a core, sched rows/s "
            f"{m['rows_per_s']:.0f} ({m['rows_per_step']:.1f} per step), "
            f"engine wall {m['wall_s']:.1f} s"
        )
    d, s = med["detail"], med["summary"]
    print(
        f"summary/detail: rows/s {s['rows_per_s'] / d['rows_per_s']:.3f}x, rows/step "
        f"{s['rows_per_step'] / d['rows_per_step']:.3f}x, "
        f"daemon CPU {s['cpu_pct'] / d['cpu_pct']:.2f}x"
    )


if __name__ == "__main__":
    main()
