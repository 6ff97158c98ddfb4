"""Benchmark: what the CPU sampler costs the sampled engine, other work, and the database.

One engine process (pure-Python ~1 ms steps on its main thread, pinned to
the last CPU; this script on the first) runs for the whole benchmark while
the probe (probes/cpu_bcc.py, loaded here with a real Store behind it)
cycles through three conditions in short windows, rotated every round so
each condition takes each slot:

  off        nothing tracked: no perf event is attached at all
  sampled    the engine tracked, its Python frames on (its layout and thread
             states handed over as ingest would: from the engine's own
             report, probe_client/_pythreads.py)
  untracked  another (sleeping) process tracked, so the cpu-clock events
             tick on every busy CPU, the engine untracked: what the sampler
             costs work it does not sample

Per window the median step time; per condition the median over rounds of
its ratio to `off` in the same round (and of the 10th percentile, the steps
nothing else interrupted). From the kernel's bpf_stats (sysctl
kernel.bpf_stats_enabled, restored at the end): the program's ns per run
while sampling and while ticking untracked. From the probe: the reader
thread's CPU per sample. From the Store: the bytes one sample costs in the
database (cpu_samples, cpu_stacks, cpu_frames copied into a fresh file)
and so the growth per thread-hour at the default 1 kHz. Needs root and bcc.

    python bench/cpu_sampler_cost.py [--rounds 80] [--window-ms 50] [--idle-s 5] [--hz 1000]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import duckdb

from stallscope.probes.base import ProbeSettings, Sink
from stallscope.probes.cpu_bcc import BccCpuProbe
from stallscope.store.database import Store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONDITIONS = ("off", "sampled", "untracked")

ENGINE = r"""
import json, sys, threading, time
from probe_client import _pythreads, wire
rep = _pythreads.Reporter()
buf = bytearray(wire.DATAGRAM_MAX)
n, _ = rep.intro.list_into(buf, 0, 100)
threads = [wire.PYTHREAD_RECORD.unpack_from(buf, i * 32)[3:5] for i in range(n)]
print(json.dumps({"layout": json.loads(rep.layout), "threads": threads}), flush=True)

def inner(k):
    x = 0
    for i in range(k):
        x += i * i
    return x

def middle(k):
    return inner(k) + inner(k // 10)

def step():
    return middle(12000)

sys.stdin.readline()
starts, durs = [], []
clock = time.monotonic_ns
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
t = clock()
while not stop.is_set():
    step()
    t1 = clock()
    starts.append(t)
    durs.append(t1 - t)
    t = t1
print(json.dumps({"starts": starts, "durs": durs}), flush=True)
"""


class StoreSink(Sink):
    def __init__(self, store):
        self.store = store
        self.losses = {}

    def append(self, table, columns):
        self.store.append(table, columns)

    def loss(self, probe, start_ns, end_ns, count, reason):
        key = reason.split(":")[0] if "ring full" in reason else reason.split(": ")[1][:40]
        self.losses[key] = self.losses.get(key, 0) + count
        self.store.record_loss(probe, start_ns, end_ns, count, reason)

    def status(self, probe, backend, state, detail):
        self.store.record_probe_status(probe, backend, state, detail)


def prog_stats(probe):
    st = next(iter(probe.program_stats().values()), {})
    return st.get("run_cnt", 0), st.get("run_time_ns", 0)


def _file_bytes(path, fill):
    con = duckdb.connect(path)
    fill(con)
    con.execute("CHECKPOINT")
    con.close()
    return os.path.getsize(path)


def table_bytes(db_path, tmp, copies=100):
    """(rows, {part: bytes}) of the CPU sampler's tables in fresh files: the
    samples replicated `copies` times, shifted in time (DuckDB allocates
    256 KiB blocks, so a few thousand rows say nothing), and the stacks and
    frames once (they do not grow with samples of the same code)."""
    empty = _file_bytes(os.path.join(tmp, "empty.duckdb"), lambda c: None)

    def samples(con):
        con.execute(f"ATTACH '{db_path}' AS s (READ_ONLY)")
        span = con.execute(
            "SELECT max(ts_ns) - min(ts_ns) + 1000000 FROM s.cpu_samples"
        ).fetchone()[0]
        con.execute(
            "CREATE TABLE cpu_samples AS SELECT pid, tid, ts_ns + k * ? AS ts_ns, cpu, stack_id, "
            "kernel_mode, unwind, stored_ns + k AS stored_ns FROM s.cpu_samples, range(?) t(k) "
            "ORDER BY ts_ns",
            [span, copies],
        )
        con.execute("DETACH s")

    def dictionaries(con):
        con.execute(f"ATTACH '{db_path}' AS s (READ_ONLY)")
        for t in ("cpu_stacks", "cpu_frames"):
            con.execute(f"CREATE TABLE {t} AS SELECT * FROM s.{t}")
        con.execute("DETACH s")

    con = duckdb.connect(db_path, read_only=True)
    n = {
        t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        for t in ("cpu_samples", "cpu_stacks", "cpu_frames")
    }
    con.close()
    sizes = {
        "samples": _file_bytes(os.path.join(tmp, "samples.duckdb"), samples) - empty,
        "dictionaries": _file_bytes(os.path.join(tmp, "dict.duckdb"), dictionaries) - empty,
    }
    n["replicated_samples"] = n["cpu_samples"] * copies
    return n, sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=80)
    ap.add_argument("--window-ms", type=float, default=50.0)
    ap.add_argument("--idle-s", type=float, default=5.0)
    ap.add_argument("--steady-s", type=float, default=5.0)
    ap.add_argument("--hz", type=float, default=1000.0, help="cpu_sample_hz (default 1000)")
    ap.add_argument(
        "--clock",
        default="timer",
        choices=("timer", "tick", "auto"),
        help="cpu_sample_clock (default timer: the figures of its rows; the daemon's default is auto)",
    )
    args = ap.parse_args()
    why = BccCpuProbe.unavailable()
    if why:
        sys.exit(f"error: the CPU sampler cannot run here: {why}")
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0]})
    tmp = tempfile.mkdtemp(prefix="stallscope-cpu-bench-")
    db = os.path.join(tmp, "b.duckdb")
    store = Store(db)
    store.start()
    sink = StoreSink(store)
    probe = BccCpuProbe(ProbeSettings(cpu_sample_hz=args.hz, cpu_sample_clock=args.clock))
    stats_was = open("/proc/sys/kernel/bpf_stats_enabled").read().strip()
    subprocess.run(["sysctl", "-q", "kernel.bpf_stats_enabled=1"], check=True)
    sleeper = subprocess.Popen(["sleep", "3600"])
    env = {**os.environ, "PYTHONPATH": ROOT}
    eng = subprocess.Popen(
        [sys.executable, "-c", ENGINE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=env,
    )  # fmt: skip
    try:
        os.sched_setaffinity(eng.pid, {cpus[-1]})
        report = json.loads(eng.stdout.readline())
        probe.start(sink)
        print(f"BPF program loaded in {probe.load_s:.1f} s; sample record {probe.record_bytes} B")
        # 1. nothing tracked: no perf event, the reader thread alone
        cpu0, (runs0, _) = probe._reader_cpu_ns, prog_stats(probe)
        time.sleep(args.idle_s)
        idle_cpu = (probe._reader_cpu_ns - cpu0) / (args.idle_s * 1e9)
        idle_runs = prog_stats(probe)[0] - runs0
        print(f"nothing tracked: attached={probe.attached}, {idle_runs} program runs in "
              f"{args.idle_s:g} s, reader {100 * idle_cpu:.4f}% of a CPU")  # fmt: skip
        # 2. rounds of the three conditions
        eng.stdin.write("\n")
        eng.stdin.flush()
        time.sleep(0.5)
        windows = []
        acc = {c: [0, 0] for c in CONDITIONS}  # runs, run ns
        samples0, reader0 = probe.samples, probe._reader_cpu_ns
        for r in range(args.rounds):
            k = r % len(CONDITIONS)
            for cond in CONDITIONS[k:] + CONDITIONS[:k]:
                if cond == "sampled":
                    probe.track(eng.pid)
                    probe.accept_layout(eng.pid, 0, report["layout"])
                    probe.set_threads(eng.pid, 0, report["threads"])
                elif cond == "untracked":
                    probe.track(sleeper.pid)
                a = prog_stats(probe)
                t0 = time.monotonic_ns()
                time.sleep(args.window_ms / 1000)
                t1 = time.monotonic_ns()
                b = prog_stats(probe)
                acc[cond][0] += b[0] - a[0]
                acc[cond][1] += b[1] - a[1]
                windows.append((r, cond, t0, t1))
                probe.untrack(eng.pid)
                probe.untrack(sleeper.pid)
        del samples0, reader0
        # 3. steady sampling (no toggling): the reader's cost per sample
        probe.track(eng.pid)
        probe.accept_layout(eng.pid, 0, report["layout"])
        probe.set_threads(eng.pid, 0, report["threads"])
        time.sleep(1.0)
        probe.drain()
        samples0, reader0, t0 = probe.samples, probe._reader_cpu_ns, time.monotonic()
        time.sleep(args.steady_s)
        probe.drain()
        steady_s = time.monotonic() - t0
        samples = probe.samples - samples0
        reader_ns = probe._reader_cpu_ns - reader0
        probe.untrack(eng.pid)
        eng.stdin.write("\n")
        eng.stdin.flush()
        steps = json.loads(eng.stdout.readline())
    finally:
        eng.kill()
        sleeper.kill()
        probe.stop()
        store.close()
        subprocess.run(["sysctl", "-q", f"kernel.bpf_stats_enabled={stats_was}"])
    import bisect

    starts, durs = steps["starts"], steps["durs"]
    per = {}
    for r, cond, a, b in windows:
        i = bisect.bisect_left(starts, a + 5_000_000)  # 5 ms after the switch
        j = bisect.bisect_left(starts, b)
        sel = sorted(durs[k] for k in range(i, j) if starts[k] + durs[k] <= b)
        if len(sel) >= 10:
            per[(r, cond)] = (statistics.median(sel), sel[len(sel) // 10])
    print(f"{args.rounds} rounds x {len(CONDITIONS)} conditions x {args.window_ms:g} ms at "
          f"{args.hz:g} Hz, engine on CPU {cpus[-1]}, median step "
          f"{statistics.median(v[0] for v in per.values()) / 1e3:.0f} us")  # fmt: skip
    for cond in CONDITIONS[1:]:
        parts = []
        for idx, label in ((0, "median"), (1, "p10")):
            ratios = [per[(r, cond)][idx] / per[(r, "off")][idx] for r in range(args.rounds)
                      if (r, cond) in per and (r, "off") in per]  # fmt: skip
            parts.append(f"{label} ratio {statistics.median(ratios):.4f}")
        runs, ns = acc[cond]
        parts.append(f"{runs} program runs, {ns / max(runs, 1):.0f} ns per run")
        print(f"{cond:10s} " + ", ".join(parts))
    print(
        f"steady {steady_s:.1f} s: {samples} samples ({samples / steady_s:.0f}/s); reader CPU "
        f"{reader_ns / max(samples, 1) / 1e3:.1f} us per sample "
        f"({100 * reader_ns / (steady_s * 1e9):.2f}% of a CPU); losses {sink.losses}"
    )
    n, sizes = table_bytes(db, tmp)
    per_sample = sizes["samples"] / max(n["replicated_samples"], 1)
    print(
        f"database: cpu_samples {per_sample:.1f} B per sample ({n['replicated_samples']:,} rows: "
        f"the {n['cpu_samples']:,} sampled, replicated) -> "
        f"{per_sample * 3.6e3 * args.hz / 2**20:.0f} MiB per thread-hour on CPU at {args.hz:g} Hz; "
        f"stacks and frames of this engine {sizes['dictionaries'] / 1024:.0f} KiB once "
        f"({n['cpu_stacks']} stack rows, {n['cpu_frames']} frames)"
    )


if __name__ == "__main__":
    main()
