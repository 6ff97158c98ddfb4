"""The page-fault probe's measured fault time against the truth, both timing methods side by side.

Loads the page-fault program twice (`oncpu_to_mapping`: each fault timed to
its page's mapping, else to the next fault; `oncpu_to_next_fault`: to the
next fault alone, the fallback where the kernel refuses the mapping end),
one after the other in each round, on the same bursts of a worker thread in
a child process (tests/helpers/fault_kinds.py): 4 KiB anonymous, 2 MiB
huge-page and copy-on-write first touches one byte a page, the same anonymous
and huge-page regions written whole (memset), and sparse faults (one page,
then --sparse-us of user work). The truth of a burst is the worker's CPU time
of the first touch minus that of the same touch once mapped; of the sparse
faults, bounded below by nothing: their cost per fault is printed instead.
Prints per kind and method the median over rounds of measured / truth, and
its range. Needs root and bcc.
Usage: python bench/fault_time_error.py [--rounds 7] [--sparse-us 2000]
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from helpers import fault_kinds  # noqa: E402
from helpers.sched import CollectSink, Workload  # noqa: E402
from stallscope.probes.faults_bcc import BccFaultsProbe  # noqa: E402

BURSTS = (
    ("anon, one byte a page", "touch anon", 16 << 20),
    ("huge, one byte a page", "touch huge", 48 << 20),
    ("file copy-on-write", "touch file", 16 << 20),
    ("anon, pages written whole", "fill anon", 16 << 20),
    ("huge, pages written whole", "fill huge", 48 << 20),
)


def _cost(probe, work, rec):
    probe.drain(final=True)
    rows = probe.sink.table("page_faults", work.tid)
    sel = (rows["start_ns"] <= rec["t1"]) & (rows["end_ns"] >= rec["t0"])
    return int(sum(c for c, s in zip(rows["cost_ns"], sel, strict=True) if s)), int(
        rows["count"][sel].sum()
    )


def _round(map_end, cached, sparse_us, sparse_pages):
    probe = BccFaultsProbe()
    probe.map_end = map_end
    probe.sink = CollectSink()
    probe.start(probe.sink)
    work = Workload()
    out = {}
    try:
        probe.track(work.pid)
        work.start_thread()
        for name, cmd, size in BURSTS:
            rec = json.loads(work.call(f"{cmd} {size} {cached}"))
            cost, _ = _cost(probe, work, rec)
            out[name] = cost / rec["truth_ns"]
        rec = json.loads(work.call(f"sparse {sparse_pages} {sparse_us}"))
        cost, counted = _cost(probe, work, rec)
        out["sparse"] = cost / max(counted, 1) / 1000  # us per fault
    finally:
        probe.untrack(work.pid)
        work.close()
        probe.stop()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sparse-us", type=int, default=2000)
    ap.add_argument("--sparse-pages", type=int, default=40)
    args = ap.parse_args()
    reason = BccFaultsProbe.unavailable()
    if reason:
        sys.exit(f"fault_time_error: {reason}")
    with tempfile.TemporaryDirectory() as tmp:
        cached = fault_kinds.cached_file(os.path.join(tmp, "cached.bin"), 16 << 20)
        results = {True: [], False: []}
        for r in range(args.rounds):
            for map_end in (True, False) if r % 2 == 0 else (False, True):
                results[map_end].append(_round(map_end, cached, args.sparse_us, args.sparse_pages))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"# {platform.node()} {platform.release()}, load {os.getloadavg()[0]:.1f}, "
          f"{args.rounds} rounds, medians [min, max]")  # fmt: skip
    print(f"{'burst':32} {'oncpu_to_mapping':>26} {'oncpu_to_next_fault':>26}")
    names = [b[0] for b in BURSTS] + ["sparse"]
    for name in names:
        cells = []
        for map_end in (True, False):
            vals = [r[name] for r in results[map_end]]
            cells.append(f"{statistics.median(vals):.3f} [{min(vals):.3f}, {max(vals):.3f}]")
        label = name if name != "sparse" else f"sparse: us per fault ({args.sparse_us} us work)"
        print(f"{label:32} {cells[0]:>26} {cells[1]:>26}")


if __name__ == "__main__":
    main()
