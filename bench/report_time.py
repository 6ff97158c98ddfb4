"""Benchmark: how long `stallscope report` takes, old tree against new, side by side.

For each tree (NAME=PATH, a checkout) and each database, a copy of the
database gets that tree's schema and views (a database keeps the views it
was written with), then `python -m stallscope.cli report --db COPY` runs
with that tree's code, rounds interleaved tree by tree so that both see the
same machine. Databases: `tiny` (built here: one run, two steps, nothing
else: what every section costs with no rows to read) and each --db file
(e.g. one written by `stallscope demo --engine vllm --duration 40 --db F`).
Prints the median wall and CPU (user + system of the report process) per
tree and database, and checks that the trees print the same report (the
figures' paths aside); it asserts nothing about time.

    .venv/bin/python bench/report_time.py --tree old=/tmp/base --tree new=. \
        [--db FILE ...] [--rounds 5]
"""

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MAKE_DB = """
import sys, duckdb
from stallscope.store.database import apply_schema
con = duckdb.connect(sys.argv[1])
apply_schema(con)
if sys.argv[2] == "tiny":
    con.execute("INSERT INTO runs (run_id, pid, label) VALUES (1, 100, 'tiny')")
    con.execute(
        "INSERT INTO spans (run_id, tid, kind, stage, batch, start_ns, end_ns, depth, seq) "
        "VALUES (1, 11, 'step', 'decode', 4, 0, 10000000, 0, 1), "
        "(1, 11, 'step', 'decode', 4, 10000000, 20000000, 0, 2)"
    )
con.close()
"""


def tree_env(path):
    path = os.path.abspath(path)
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{path}/daemon:{path}"
    return env


def prepare(tree, name, source, folder):
    """A copy of `source` (or a new tiny database) with `tree`'s schema and views."""
    copy = Path(folder) / f"{name}.duckdb"
    if source != "tiny":
        shutil.copyfile(source, copy)
    subprocess.run(
        [sys.executable, "-c", MAKE_DB, str(copy), source], env=tree_env(tree), check=True
    )
    return copy


def one_report(tree, db):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "stallscope.cli", "report", "--db", str(db)],
        env=tree_env(tree),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH (a checkout)")
    ap.add_argument("--db", action="append", default=[], help="a database file to report on")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    sources = {"tiny": "tiny"}
    for db in args.db:
        if not os.path.exists(db):
            sys.exit(f"no database at {db}")
        sources[Path(db).stem] = db
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        copies = {}
        for tname, tpath in trees.items():
            os.makedirs(f"{tmp}/{tname}")
            for dname, source in sources.items():
                copies[tname, dname] = prepare(tpath, dname, source, f"{tmp}/{tname}")
        texts = {}
        for r in range(args.rounds):
            for dname in sources:
                for tname, tpath in trees.items():
                    wall, cpu, out = one_report(tpath, copies[tname, dname])
                    results.setdefault((tname, dname), []).append((wall, cpu))
                    texts.setdefault((tname, dname), set()).add(out)
                    print(f"round {r + 1} {dname:<12} {tname:<6} wall {wall:6.2f} s  cpu {cpu:6.2f} s",
                          flush=True)  # fmt: skip
    print(
        f"\nmedians of {args.rounds} rounds, cpus {os.cpu_count()}, load {os.getloadavg()[0]:.1f}"
    )
    for dname in sources:
        for tname in trees:
            walls = [w for w, _ in results[tname, dname]]
            cpus = [c for _, c in results[tname, dname]]
            print(f"  {dname:<12} {tname:<6} wall {statistics.median(walls):6.2f} s  "
                  f"cpu {statistics.median(cpus):6.2f} s  (walls {', '.join(f'{w:.2f}' for w in walls)})")  # fmt: skip
        outs = [texts[t, dname] for t in trees]
        if any(len(o) > 1 for o in outs):
            print(f"  {dname}: a tree printed different reports from one round to the next")
        elif len({next(iter(o)) for o in outs}) > 1:
            print(f"  {dname}: the trees print different reports")


if __name__ == "__main__":
    main()
