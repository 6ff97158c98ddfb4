"""Runs every benchmark in bench/ one after another and prints their output.

Benchmarks measure ratios side by side within one run, so each script is
self-contained; this only runs them in sequence (never in parallel: they
would disturb each other on a small machine). Usage: python bench/run_all.py
[NAME ...] where NAME is a script name without .py.
"""

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# not benchmarks by themselves: this runner, the row checker, a helper module,
# and the two that read a database named on their command line (--db)
SKIP = {"run_all", "check", "views_copy", "peer_share", "oncpu_share"}


def main(names):
    scripts = sorted(p for p in HERE.glob("*.py") if p.stem not in SKIP)
    if names:
        scripts = [p for p in scripts if p.stem in names]
    failed = 0
    for script in scripts:
        print(f"## {script.stem}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, str(script)])
        print(f"(exit {rc}, {time.monotonic() - t0:.0f} s)\n", flush=True)
        failed += rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
