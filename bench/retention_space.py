"""What gives disk space back in a stallscope DuckDB file (retention's question).

Fills a database with N runs of spans through the daemon's Store, then
deletes the oldest half of the runs and reports, after each step, the used
bytes (used blocks + WAL) and the file's length: DELETE alone, CHECKPOINT,
VACUUM, new inserts after that, deleting the newest runs (the file's tail),
and a copy into a fresh file (COPY FROM DATABASE). Run:
    .venv/bin/python bench/retention_space.py [runs] [spans_per_run]
"""

import os
import sys
import tempfile
import time

import duckdb
import numpy as np

from stallscope.store.database import Store
from stallscope.store.retention import used_bytes


def fill_run(store, run_id, n):
    rng = np.random.default_rng(run_id)
    ts = run_id * 10**12 + np.arange(n, dtype=np.int64) * 1000
    store.append(
        "spans",
        {
            "run_id": np.full(n, run_id, dtype=np.int64),
            "tid": rng.integers(1, 1 << 20, n),
            "kind": ["step"] * n,
            "stage": ["recurrent"] * n,
            "batch": rng.integers(1, 96, n),
            "start_ns": ts,
            "end_ns": ts + rng.integers(10**5, 10**7, n),
            "seq": np.arange(n, dtype=np.int64),
        },
    )
    store.flush()


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    per_run = int(sys.argv[2]) if len(sys.argv) > 2 else 500_000
    d = tempfile.mkdtemp()
    path = os.path.join(d, "bench.duckdb")
    store = Store(path)
    for r in range(1, runs + 1):
        fill_run(store, r, per_run)
    cur = store.cursor()
    rows = []

    def report(step):
        rows.append(
            (
                step,
                used_bytes(cur, path) / 2**20,
                sum(os.path.getsize(p) for p in (path, path + ".wal") if os.path.exists(p)) / 2**20,
            )
        )

    cur.execute("CHECKPOINT")
    report(f"{runs} runs x {per_run} spans, checkpointed")
    half = runs // 2
    t0 = time.monotonic()
    cur.execute("DELETE FROM spans WHERE run_id <= ?", [half])
    report(f"DELETE oldest {half} runs ({(time.monotonic() - t0) * 1e3:.0f} ms)")
    t0 = time.monotonic()
    cur.execute("CHECKPOINT")
    report(f"CHECKPOINT ({(time.monotonic() - t0) * 1e3:.0f} ms)")
    cur.execute("VACUUM")
    cur.execute("CHECKPOINT")
    report("VACUUM + CHECKPOINT")
    for r in range(runs + 1, runs + 1 + half):
        fill_run(store, r, per_run)
    cur.execute("CHECKPOINT")
    report(f"insert {half} new runs + CHECKPOINT (free blocks reused?)")
    cur.execute("DELETE FROM spans WHERE run_id > ?", [runs])
    cur.execute("CHECKPOINT")
    report(f"DELETE the {half} newest runs (file tail) + CHECKPOINT")
    cur.close()
    store.close()
    copy = os.path.join(d, "copy.duckdb")
    con = duckdb.connect(path)
    t0 = time.monotonic()
    con.execute(f"ATTACH '{copy}' AS fresh")
    con.execute("COPY FROM DATABASE bench TO fresh")
    con.execute("DETACH fresh")
    took = (time.monotonic() - t0) * 1e3
    con.close()
    rows.append(
        (
            f"COPY FROM DATABASE into a new file ({took:.0f} ms)",
            float("nan"),
            os.path.getsize(copy) / 2**20,
        )
    )
    print(f"duckdb {duckdb.__version__}")
    print("| step | used MiB (blocks + WAL) | file MiB |\n|---|---:|---:|")
    for step, used, size in rows:
        print(f"| {step} | {used:.1f} | {size:.1f} |")


if __name__ == "__main__":
    main()
