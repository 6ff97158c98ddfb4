"""Benchmark: how long `stallscope report` takes, old tree against new, side by side.

For each tree (NAME=PATH, a checkout) and each database, a copy of the
database gets that tree's schema and views (a database keeps the views it
was written with), then `python -m stallscope.cli report --db COPY` runs
with that tree's code, rounds interleaved tree by tree so that both see the
same machine. Databases: `tiny` (built here: one run, two steps, nothing
else: what every section costs with no rows to read) and each --db file
(e.g. one written by `stallscope demo --engine vllm --duration 40 --db F`)
and, with --scale S, attribution_scale.py's synthetic serving run (S x 1 M
steps, 10 M off-CPU rows, 1 M GC passes; step_components filled as the
daemon fills it) in a file. Prints the median wall, CPU (user + system of
the report process) and peak RSS per tree and database, and checks that the
trees print the same report (the figures' paths aside); it asserts nothing
about time.

    .venv/bin/python bench/report_time.py --tree old=/tmp/base --tree new=. \
        [--db FILE ...] [--scale 0.25] [--rounds 5]
"""

import argparse
import difflib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trees import tree_env

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


def prepare(tree, name, source, folder):
    """A copy of `source` (or a new tiny database) with `tree`'s schema and views."""
    copy = Path(folder) / f"{name}.duckdb"
    if source != "tiny":
        shutil.copyfile(source, copy)
    subprocess.run(
        [sys.executable, "-c", MAKE_DB, str(copy), source], env=tree_env(tree), check=True
    )
    return copy


# The CLI's report, then its own peak RSS (KiB) on stderr's last line: VmHWM,
# not getrusage's ru_maxrss, which Linux carries over an exec from the
# parent (this bench, holding a synthetic database, would be the floor). Run
# from a file: under `python -c` DuckDB turns its progress bar on, and the
# bars (their elapsed times) would land in the report's text.
REPORT_WITH_PEAK = """
import runpy, sys
sys.argv = ["stallscope", "report", "--db", sys.argv[1]]
try:
    runpy.run_module("stallscope.cli", run_name="__main__")
finally:
    with open("/proc/self/status") as f:
        hwm = [ln.split()[1] for ln in f if ln.startswith("VmHWM:")][0]
    print(hwm, file=sys.stderr)
"""


def synthetic_db(scale, folder):
    """attribution_scale.py's tables at `scale` in a database file, views
    made and step_components filled; its path."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import duckdb

    import attribution_scale as synth

    path = Path(folder) / f"scale{scale:g}.duckdb"
    con = synth.build(duckdb.connect(str(path)), scale)
    synth.fill(con)
    con.close()
    return str(path)


def one_report(tree, db):
    """(wall s, CPU s, peak RSS MB, text) of one `stallscope report`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    wrapper = Path(db).parent / "report_with_peak.py"
    if not wrapper.exists():
        wrapper.write_text(REPORT_WITH_PEAK)
    done = subprocess.run(
        [sys.executable, str(wrapper), str(db)],
        env=tree_env(tree),
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"report on {db} with {tree} failed:\n{done.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    peak_mb = int(done.stderr.strip().splitlines()[-1]) / 1024
    return wall, cpu, peak_mb, done.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH (a checkout)")
    ap.add_argument("--db", action="append", default=[], help="a database file to report on")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scale", type=float, action="append", default=[],
                    help="a synthetic database of this many x 1 M steps (repeatable)")  # fmt: skip
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    sources = {"tiny": "tiny"}
    for db in args.db:
        if not os.path.exists(db):
            sys.exit(f"no database at {db}")
        sources[Path(db).stem] = db
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for scale in args.scale:
            print(f"building the synthetic database at scale {scale:g}", flush=True)
            path = synthetic_db(scale, tmp)
            sources[Path(path).stem] = path
        copies = {}
        for tname, tpath in trees.items():
            os.makedirs(f"{tmp}/{tname}")
            for dname, source in sources.items():
                copies[tname, dname] = prepare(tpath, dname, source, f"{tmp}/{tname}")
        texts = {}
        for r in range(args.rounds):
            for dname in sources:
                for tname, tpath in trees.items():
                    wall, cpu, peak, out = one_report(tpath, copies[tname, dname])
                    results.setdefault((tname, dname), []).append((wall, cpu, peak))
                    texts.setdefault((tname, dname), set()).add(out)
                    print(f"round {r + 1} {dname:<12} {tname:<6} wall {wall:6.2f} s  cpu {cpu:6.2f} s  "
                          f"peak RSS {peak:6.0f} MB", flush=True)  # fmt: skip
    print(
        f"\nmedians of {args.rounds} rounds, cpus {os.cpu_count()}, load {os.getloadavg()[0]:.1f}"
    )
    for dname in sources:
        for tname in trees:
            walls = [w for w, _, _ in results[tname, dname]]
            cpus = [c for _, c, _ in results[tname, dname]]
            peaks = [p for _, _, p in results[tname, dname]]
            print(f"  {dname:<12} {tname:<6} wall {statistics.median(walls):6.2f} s  "
                  f"cpu {statistics.median(cpus):6.2f} s  peak RSS {statistics.median(peaks):6.0f} MB  "
                  f"(walls {', '.join(f'{w:.2f}' for w in walls)})")  # fmt: skip
        outs = [sorted(texts[t, dname]) for t in trees]
        pair = None
        if any(len(o) > 1 for o in outs):
            print(f"  {dname}: a tree printed different reports from one round to the next")
            pair = next(o for o in outs if len(o) > 1)[:2]
        elif len({o[0] for o in outs}) > 1:
            print(f"  {dname}: the trees print different reports")
            pair = [outs[0][0], next(o[0] for o in outs if o[0] != outs[0][0])]
        if pair:  # where they part, so that a reader can tell noise from a defect
            diff = difflib.unified_diff(
                pair[0].splitlines(), pair[1].splitlines(), lineterm="", n=1
            )
            print("\n".join(list(diff)[:30]))


if __name__ == "__main__":
    main()
