"""Benchmark: what the daemon costs a real vLLM engine it traces, thread by thread.

Runs `stallscope demo --engine vllm` (vLLM's CPU build: the engine core and
its worker, the default probes, the CPU sampler on, as root) and, from
outside, reads every daemon thread's CPU time from /proc every 0.2 s while
it runs. Afterwards, from the demo's database: the engine core's steps
(count and window) and, per daemon thread, how often and for how long it
was the task that took the engine core's CPU while the core was still
runnable (offcpu rows with `preempted`, preemptor_pid = the daemon) inside
that window, split by `offcpu.yielded`: on 2 vCPUs the core gives its CPU
away while it waits for the worker (vLLM's shared-memory queue spins with
sched_yield), and a runnable daemon thread, idle priority or not, gets it
then. Those are yields (`yields_by_daemon`), not preemptions (`by_daemon`);
a tree whose database has no `yielded` column counts them all as
preemptions, as it did.

`--tree DIR` (repeatable) runs the demo with DIR's daemon (bench/trees.py),
the trees alternating, `--rounds` each. Needs root and the vllm extra
(`STALLSCOPE_VLLM=1 make bootstrap`). Never asserts.

Usage: python bench/vllm_daemon_cost.py [--tree old=/tmp/x --tree new=.] [--rounds 2] [--duration 40]
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

from trees import tree_env

ROOT = Path(__file__).resolve().parent.parent


def daemon_pid(parent):
    """The daemon child of the demo process `parent` (a thread named stallscope/cpu-)."""
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/comm") as f:
                    if f.read().startswith("stallscope/cpu-"):
                        return int(p)
        except (OSError, ValueError, IndexError):
            continue
    return None


def thread_cpu(pid):
    """{tid: (comm, CPU seconds)} of every thread of `pid`."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
            out[int(t)] = (comm, (int(st[11]) + int(st[12])) / tick)
        except (OSError, ValueError, IndexError):
            continue
    return out


def one_run(tree, duration):
    tmp = Path(tempfile.mkdtemp(prefix="stallscope-vllm-cost-"))
    db = tmp / "demo.duckdb"
    env = dict(os.environ) if tree is None else tree_env(tree)  # its code and views
    cmd = [str(ROOT / ".venv" / "bin" / "stallscope"), "demo", "--engine", "vllm",
           "--duration", str(duration), "--db", str(db)]  # fmt: skip
    demo = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    seen = {}  # tid -> (comm, last CPU seconds)
    found = []  # the daemon's pid
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            if not found and (pid := daemon_pid(demo.pid)) is not None:
                found.append(pid)
            if found:
                try:
                    seen.update(thread_cpu(found[0]))
                except OSError:
                    pass
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    rc = demo.wait(timeout=duration + 600)
    stop.set()
    watcher.join()
    cpu = {}
    for comm, s in seen.values():
        cpu[comm] = round(cpu.get(comm, 0.0) + s, 2)
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    core = con.execute(
        "SELECT r.pid, count(*), min(s.start_ns), max(s.end_ns) FROM spans s JOIN runs r USING (run_id) "
        "WHERE s.kind = 'step' AND r.label LIKE '%/child-%' AND r.label NOT LIKE '%/child-%/child-%' "
        "GROUP BY r.pid ORDER BY 2 DESC LIMIT 1"
    ).fetchone()
    out = {"rc": rc, "daemon_cpu_s": cpu}
    if core is None or not found:
        return out
    pid, steps, lo, hi = core
    columns = {d[0] for d in con.execute("SELECT * FROM offcpu LIMIT 0").description}
    yielded = "coalesce(yielded, false)" if "yielded" in columns else "false"
    rows = con.execute(
        f"SELECT preemptor_comm, {yielded} AS y, count(*), sum(end_ns - start_ns) FROM offcpu "
        "WHERE pid = ? AND preempted AND preemptor_pid = ? AND start_ns BETWEEN ? AND ? "
        "GROUP BY ALL ORDER BY 4 DESC",
        [pid, found[0], lo, hi],
    ).fetchall()
    pre = [(c, n, ns) for c, y, n, ns in rows if not y]
    yields = [(c, n, ns) for c, y, n, ns in rows if y]
    out.update({
        "core_steps": steps,
        "core_window_s": round((hi - lo) / 1e9, 2),
        "by_daemon": sum(n for _, n, _ in pre),
        "by_daemon_ms": round(sum(ns for _, _, ns in pre) / 1e6, 1),
        "by_thread": {c: [n, round(ns / 1e6, 1)] for c, n, ns in pre},
        "yields_known": "yielded" in columns,
        "yields_by_daemon": sum(n for _, n, _ in yields),
        "yields_by_daemon_ms": round(sum(ns for _, _, ns in yields) / 1e6, 1),
        "yields_by_thread": {c: [n, round(ns / 1e6, 1)] for c, n, ns in yields},
    })  # fmt: skip
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", default=[], help="NAME=DIR (repeatable)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=40.0)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("vllm_daemon_cost: needs root (the bcc probes and the CPU sampler)")
    trees = [t.split("=", 1) for t in args.tree] or [["this", None]]
    results = {name: [] for name, _ in trees}
    for k in range(args.rounds):
        for name, tree in trees:
            print(f"round {k + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
            r = one_run(tree and str(Path(tree).resolve()), args.duration)
            results[name].append(r)
            print(f"{name} {json.dumps(r)}", flush=True)
    for name, runs in results.items():
        keys = ("core_steps", "core_window_s", "by_daemon", "by_daemon_ms")
        keys += ("yields_by_daemon", "yields_by_daemon_ms")
        med = {k: statistics.median(r.get(k, 0) for r in runs) for k in keys}
        reader = [r["daemon_cpu_s"].get("stallscope/cpu-", 0.0) for r in runs]
        total = [round(sum(r["daemon_cpu_s"].values()), 2) for r in runs]
        print(f"{name:6s} medians {med}; CPU sampler reader s {reader}; daemon CPU s {total}")


if __name__ == "__main__":
    main()
