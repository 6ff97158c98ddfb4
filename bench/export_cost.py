"""What the Parquet export costs: the stored_ns column at ingest, and export speed.

1. Ingest: two real Stores side by side, one as shipped (every table has
   stored_ns, filled per flush from a session variable), one with the column
   dropped from `spans`; the same 127k-row span batches are appended and
   flushed into each, alternating, and the median flush time of each is
   reported with their ratio.
2. Export: a database of N synthetic steps (spans) and GC passes written by
   a Store, exported with `export_parquet`: the first export (rows/s), a
   re-run with nothing new, and an incremental one after 10% more rows.

Usage: python bench/export_cost.py [--rows N] [--repeats R]
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np

from stallscope.export.parquet import export_parquet
from stallscope.store.database import Store

BATCH = 127_000


def spans(n, start, run_id=1):
    ts = start + np.arange(n, dtype=np.int64) * 1000
    return {
        "run_id": np.full(n, run_id, dtype=np.int64),
        "tid": np.full(n, 7, dtype=np.int64),
        "kind": ["step"] * n,
        "stage": ["decode"] * n,
        "batch": np.full(n, 8, dtype=np.int64),
        "start_ns": ts,
        "end_ns": ts + 900,
        "depth": np.zeros(n, dtype=np.int16),
        "seq": np.arange(n, dtype=np.int64),
    }


def ingest(tmp, repeats):
    shipped = Store(str(tmp / "shipped.duckdb"))
    bare = Store(str(tmp / "bare.duckdb"))
    bare.con.execute("ALTER TABLE spans DROP COLUMN stored_ns")
    times = {"shipped": [], "bare": []}
    for i in range(repeats):
        for name, store in (("shipped", shipped), ("bare", bare))[:: 1 if i % 2 else -1]:
            store.append("spans", spans(BATCH, i * BATCH * 1000))
            t0 = time.perf_counter()
            store.flush()
            times[name].append(time.perf_counter() - t0)
    shipped.close()
    bare.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"ingest: flush of {BATCH} span rows, median of {repeats}: "
        f"with stored_ns {med['shipped'] * 1e3:.1f} ms, without {med['bare'] * 1e3:.1f} ms, "
        f"ratio {med['shipped'] / med['bare']:.3f} "
        f"({BATCH / med['shipped'] / 1e6:.2f} vs {BATCH / med['bare'] / 1e6:.2f} M rows/s)"
    )


def export(tmp, rows):
    db = str(tmp / "export.duckdb")
    store = Store(db)
    for i in range(0, rows, BATCH):
        store.append("spans", spans(min(BATCH, rows - i), i * 1000))
        store.flush()
    store.close()
    out = str(tmp / "out")

    def run():
        con = duckdb.connect(db, read_only=True)
        try:
            t0 = time.perf_counter()
            result = export_parquet(con, out, "bench")
            return time.perf_counter() - t0, result
        finally:
            con.close()

    first, r1 = run()
    again, r2 = run()
    store = Store(db)
    store.append("spans", spans(rows // 10, rows * 1000, run_id=2))
    store.close()
    more, r3 = run()
    size = sum(p.stat().st_size for p in Path(out).rglob("*.parquet"))
    print(
        f"export: first {r1.rows['spans']} spans in {first:.2f} s "
        f"({r1.rows['spans'] / first / 1e6:.2f} M rows/s, {size / 2**20:.1f} MiB of Parquet); "
        f"re-run {sum(r2.rows.values())} rows in {again:.2f} s; "
        f"incremental {r3.rows['spans']} rows in {more:.2f} s"
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--repeats", type=int, default=15)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        ingest(Path(d), a.repeats)
        export(Path(d), a.rows)


if __name__ == "__main__":
    main()
