"""Times `step_attribution` over synthetic tables of growing size.

Generates, with numpy, engine steps (each with one submit span), off-CPU
intervals, run-queue waits, migrations, GC passes and 10 Hz NVML samples
shaped like a serving
run (steps of ~5 ms with a rare slow one; most kernel rows on the step
threads, the rest on other threads of the same processes), loads them into
an in-memory DuckDB through Arrow, creates the views, fills
`step_components` as the daemon does (store/step_fill.py: everything but
the last second of steps, one run-time slice a cycle as the daemon fills a
backlog, then the cycle for that last second, both timed) and times a full aggregate over `step_attribution`, read three
ways, interleaved: `table` (the shipped views: stored rows for the filled
steps), `recompute` (the same views with `step_components_table = false`:
every step from the source tables) and, with --versus, another queries/
directory (e.g. the views before step_components: `git archive <commit>
queries | tar -x -C /tmp/old`). It measures; it asserts nothing about time,
and warns if the three give different rows. With --groups the runs come in
pairs of one run group (runs.group_key), the second of each pair a worker
whose every step starts 0.3 ms inside the first's step and ends before it
(what step_attribution's peer spans match): the cost of that join.

    .venv/bin/python bench/attribution_scale.py [--scales 0.1,0.25,1] [--repeat 3]
        [--versus DIR] [--no-fill] [--groups]

Wall time depends on what else runs on the machine; CPU time (all threads of
this process) much less, so both are printed.

Full size (scale 1): 1 M steps, 10 M offcpu rows, 1 M GC rows.
"""

import argparse
import os
import platform
import statistics
import time

import duckdb
import numpy as np
import pyarrow as pa

from stallscope.store import views
from stallscope.store.database import apply_schema
from stallscope.store.step_fill import StepFiller

STEP_NS = 5_000_000
RUNS = 10


def make_tables(scale, seed=1, groups=False):
    rng = np.random.default_rng(seed)
    n_steps = int(1_000_000 * scale)
    n_off = int(10_000_000 * scale)
    n_gc = int(1_000_000 * scale)
    per_run = n_steps // RUNS
    run_id = np.repeat(np.arange(1, RUNS + 1), per_run)
    n_steps = len(run_id)
    tid = 1000 + run_id * 10  # one engine thread per run
    dur = rng.normal(STEP_NS, STEP_NS * 0.03, n_steps).astype(np.int64)
    slow = rng.random(n_steps) < 0.02
    dur[slow] += rng.integers(1_000_000, 100_000_000, slow.sum())
    gap = rng.integers(50_000, 200_000, n_steps)
    # per-run cumulative time; runs are placed one after another
    t = np.zeros(n_steps, dtype=np.int64)
    for r in range(RUNS):
        sl = slice(r * per_run, (r + 1) * per_run)
        t[sl] = 10**12 * (r + 1) + np.cumsum(dur[sl] + gap[sl]) - (dur[sl] + gap[sl])
    start, end = t, t + dur
    if groups:  # odd runs: the peer (worker) of the run before, inside each of its steps
        for r in range(1, RUNS, 2):
            sl, drv = slice(r * per_run, (r + 1) * per_run), slice((r - 1) * per_run, r * per_run)
            start[sl] = start[drv] + 300_000
            end[sl] = end[drv] - rng.integers(10_000, 200_000, per_run)
    stages = np.array(["prefill", "prelude", "recurrent", "coda"])
    stage = stages[rng.integers(0, 4, n_steps)]
    batch = rng.integers(1, 9, n_steps).astype(np.int32)
    sub_start = start + 200_000
    sub_end = sub_start + rng.integers(500_000, 1_500_000, n_steps)
    spans = pa.table(
        {
            "run_id": np.concatenate([run_id, run_id]),
            "tid": np.concatenate([tid, tid]),
            "kind": pa.array(
                np.concatenate([np.full(n_steps, "step"), np.full(n_steps, "submit")])
            ),
            "stage": pa.array(np.concatenate([stage, stage])),
            "batch": np.concatenate([batch, batch]),
            "start_ns": np.concatenate([start, sub_start]),
            "end_ns": np.concatenate([end, sub_end]),
            "depth": np.concatenate([np.zeros(n_steps, np.int16), np.ones(n_steps, np.int16)]),
            "seq": np.arange(2 * n_steps, dtype=np.int64),
        }
    )
    runs = pa.table(
        {
            "run_id": np.arange(1, RUNS + 1),
            "pid": (np.arange(1, RUNS + 1) * 10 + 1000).astype(np.int32),
            "label": [f"run_{i:02d}" for i in range(1, RUNS + 1)],
            "group_key": [f"g{(i - 1) // 2}" if groups else None for i in range(1, RUNS + 1)],
        }
    )
    # off-CPU: 70% on the step thread, inside random steps; the rest elsewhere
    k = rng.integers(0, n_steps, n_off)
    on_step = rng.random(n_off) < 0.7
    o_start = start[k] + (rng.random(n_off) * dur[k] * 0.9).astype(np.int64)
    o_len = rng.integers(2_000, 200_000, n_off)
    o_tid = np.where(on_step, tid[k], tid[k] + 1 + rng.integers(0, 4, n_off))
    offcpu = pa.table(
        {
            "pid": (run_id[k] * 10 + 1000).astype(np.int32),
            "tid": o_tid.astype(np.int32),
            "start_ns": o_start,
            "end_ns": o_start + o_len,
            "preempted": rng.random(n_off) < 0.3,
            "cpu": rng.integers(0, 2, n_off).astype(np.int16),
        }
    )
    order = np.lexsort((o_start, o_tid))
    offcpu = offcpu.take(order)
    n_q = n_off // 2
    runq = pa.table(
        {
            "pid": offcpu["pid"][:n_q],
            "tid": offcpu["tid"][:n_q],
            "start_ns": offcpu["start_ns"][:n_q],
            "end_ns": pa.array(offcpu["start_ns"][:n_q].to_numpy() + 5_000),
            "cpu": offcpu["cpu"][:n_q],
        }
    )
    n_m = n_off // 20
    migrations = pa.table(
        {
            "pid": offcpu["pid"][:n_m],
            "tid": offcpu["tid"][:n_m],
            "ts_ns": offcpu["start_ns"][:n_m],
            "from_cpu": np.zeros(n_m, np.int16),
            "to_cpu": np.ones(n_m, np.int16),
        }
    )
    kg = np.sort(rng.integers(0, n_steps, n_gc))
    g_start = start[kg] + (rng.random(n_gc) * dur[kg]).astype(np.int64)
    gen = rng.choice([0, 1, 2], n_gc, p=[0.9, 0.09, 0.01]).astype(np.int8)
    g_len = np.where(gen == 2, 90_000_000, rng.integers(20_000, 2_000_000, n_gc))
    gc_events = pa.table(
        {
            "run_id": run_id[kg],
            "tid": tid[kg],
            "generation": gen,
            "start_ns": g_start,
            "end_ns": g_start + g_len,
            "collected": rng.integers(0, 1000, n_gc),
            "uncollectable": np.zeros(n_gc, np.int64),
        }
    )
    # NVML samples of one GPU at 10 Hz over every run; 1% of them a thermal clock drop
    ts = np.concatenate(
        [
            np.arange(start[r * per_run], end[(r + 1) * per_run - 1], 100_000_000)
            for r in range(RUNS)
        ]
    )
    drop = rng.random(len(ts)) < 0.01
    nvml = pa.table(
        {
            "gpu": np.zeros(len(ts), np.int32),
            "ts_ns": ts,
            "sm_clock_mhz": np.where(drop, 1500, 1980).astype(np.int32),
            "clock_event_reasons": pa.array(np.where(drop, 0x20, 0).astype(np.uint64)),
        }
    )
    return {
        "spans": spans,
        "runs": runs,
        "offcpu": offcpu,
        "runq": runq,
        "migrations": migrations,
        "gc_events": gc_events,
        "nvml_samples": nvml,
    }


QUERY = """SELECT count(*), count(cause), sum(gc_ns), sum(preempted_ns), sum(blocked_ns),
                  sum(runq_ns), sum(migrations), sum(submit_excess_ns), sum(gpu_clock_ns)
           FROM step_attribution"""
# How many steps matched a peer span (the views of this release; 0 before).
PEERS = "SELECT count(*) FILTER (peers > 0), count(*) FILTER (cause = 'peer') FROM step_attribution"


def load_views(con, queries_dir):
    """(Re)create the views of queries_dir (None: this checkout's)."""
    old = os.environ.pop("STALLSCOPE_QUERIES", None)
    try:
        if queries_dir:
            os.environ["STALLSCOPE_QUERIES"] = queries_dir
        failures = views.create_views(con)
        assert not failures, failures
    finally:
        os.environ.pop("STALLSCOPE_QUERIES", None)
        if old is not None:
            os.environ["STALLSCOPE_QUERIES"] = old


def build(con, scale, groups=False):
    """`con` with the schema, make_tables(scale)'s rows and this checkout's
    views (report_time.py builds its synthetic database file with it too)."""
    apply_schema(con)
    for name, tbl in make_tables(scale, groups=groups).items():
        con.register("_t", tbl)
        con.execute(f'INSERT INTO "{name}" BY NAME SELECT * FROM _t')
        con.unregister("_t")
    load_views(con, None)
    return con


def timed(con, sql=QUERY, params=None):
    w0, c0 = time.perf_counter(), time.process_time()
    row = con.execute(sql, params or []).fetchone()
    return time.perf_counter() - w0, time.process_time() - c0, row


class _Store:
    """What the filler needs of the daemon's Store: a cursor, a flush."""

    def __init__(self, con):
        self.con = con

    def flush(self):
        pass

    def cursor(self):
        return self.con.cursor()


def fill(con):
    """Fill step_components up to 1 s before the last step's end, as the
    daemon fills a backlog (one run-time slice a cycle, cycles until none is
    left: a single cycle filled one slice, ~1 % of the steps at scale 1, and
    the `table` arm then recomputed the rest), then that last second; returns
    (wall s, CPU s, steps, cycles) of the backlog and of the last second."""
    last = con.execute("SELECT max(end_ns) FROM spans").fetchone()[0]
    filler = StepFiller(_Store(con), settle_ns=0)
    out = []
    for now_ns in (last - 1_000_000_000, last + 1):
        w0, c0 = time.perf_counter(), time.process_time()
        n = cycles = 0
        while True:
            got = filler.cycle(now_ns=now_ns)
            n += got
            cycles += 1
            # on while slices are left, or while cycles still fill (more
            # threads than one cycle takes); a cycle that fills nothing
            # past the backlog ends it (steps after now_ns stay unsettled)
            if not filler.backlog and not (got and filler._more):
                break
        out.append((time.perf_counter() - w0, time.process_time() - c0, n, cycles))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="0.1,0.25,1")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--versus", default=None, help="another queries/ directory to time alongside")
    ap.add_argument("--no-fill", action="store_true", help="leave step_components empty")
    ap.add_argument("--groups", action="store_true", help="runs in pairs of one run group")
    args = ap.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, duckdb {duckdb.__version__}, "
        f"load average at start {os.getloadavg()[0]:.1f}"
    )
    variants = [("table", None), ("recompute", None)]
    variants += [("versus", args.versus)] if args.versus else []
    print(
        "| views | scale | steps | offcpu | gc | median wall s | median CPU s | wall runs (s) | slow steps |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for scale in [float(s) for s in args.scales.split(",")]:
        con = build(duckdb.connect(), scale, groups=args.groups)
        sizes = {
            t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("spans", "offcpu", "gc_events")
        }
        if not args.no_fill:
            (bw, bc, bn, bk), (iw, ic, i_n, ik) = fill(con)
            print(
                f"fill at scale {scale}: {bn:,} steps in {bk} cycles {bw:.2f} s wall {bc:.2f} s "
                f"CPU; then the last second's {i_n:,} steps in {ik} {iw:.2f} s wall {ic:.2f} s CPU",
                flush=True,
            )
        results = {v: [] for v, _ in variants}
        rows = {}
        for _ in range(args.repeat):
            for v, d in variants:  # interleaved, so all see the same machine load
                load_views(con, d)
                if v == "recompute":
                    con.execute("SET VARIABLE step_components_table = false")
                wall, cpu, row = timed(con)
                con.execute("RESET VARIABLE step_components_table")
                results[v].append((wall, cpu))
                rows[v] = row
        if len(set(rows.values())) > 1:  # expected with --groups against older views
            print(f"WARNING: results differ: {rows}")
        if args.groups:
            load_views(con, None)
            matched, peer = con.execute(PEERS).fetchone()
            print(f"steps with a peer span: {matched:,}; cause peer: {peer:,}", flush=True)
        for v, _ in variants:
            walls = [w for w, _ in results[v]]
            cpus = [c for _, c in results[v]]
            print(
                f"| {v} | {scale} | {sizes['spans'] // 2:,} | {sizes['offcpu']:,} | "
                f"{sizes['gc_events']:,} | {statistics.median(walls):.2f} | "
                f"{statistics.median(cpus):.2f} | {', '.join(f'{x:.2f}' for x in walls)} | "
                f"{rows[v][1]:,} |",
                flush=True,
            )
        con.close()


if __name__ == "__main__":
    main()
