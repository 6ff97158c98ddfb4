"""Times the run-group lineage a HELLO costs the daemon (ingest/runs.py).

A new run whose daemon already knows another live run walks the kernel's
ppid chain of the client (`RunRegistry._ancestors`: one `/proc/PID/stat`
read per ancestor, at most MAX_ANCESTORS) to find its parent run. This
times that walk from this process (its chain is as deep as the shell, make
and pytest above it), in rounds, and prints the median per call and per
ancestor read. It measures; it asserts nothing.

    .venv/bin/python bench/hello_lineage_cost.py [--rounds 7] [--calls 2000]
"""

import argparse
import os
import statistics
import time

from stallscope.ingest.runs import MAX_ANCESTORS, RunRegistry


class _Registry(RunRegistry):
    def __init__(self):  # only what _ancestors reads
        self.proc_root = "/proc"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    reg, pid = _Registry(), os.getpid()
    chain = reg._ancestors(pid)
    per_call = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(args.calls):
            reg._ancestors(pid)
        per_call.append((time.perf_counter() - t0) / args.calls * 1e6)
    med = statistics.median(per_call)
    print(
        f"load average {os.getloadavg()[0]:.1f}; chain of {len(chain)} ancestors "
        f"(at most {MAX_ANCESTORS}); per HELLO {med:.1f} us median "
        f"({', '.join(f'{x:.1f}' for x in per_call)}); per ancestor {med / max(1, len(chain)):.1f} us"
    )


if __name__ == "__main__":
    main()
