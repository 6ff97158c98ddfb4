"""Lists the BENCHMARKS.md rows that are out of date (`make bench-check`).

Every row of the summary table names, in its `measured` column, the commit
it was measured at and the date (`abc1234 2026-12-01`), and in its `covers`
column the paths whose change can move its figure (the benchmark script and
the code it exercises). A row is stale when one of those paths changed
between its commit and HEAD (`git diff --name-only COMMIT HEAD -- PATHS`),
when its commit is unknown to this repository, or when it has no stamp at
all. A path written `:!path` (git's exclude pathspec) leaves that part of a
covered folder out: the daemon-wide rows cover `daemon/stallscope` but not
the report's own modules, which the daemon process never imports
(tests/api/test_read_commands.py checks that). Prints one line per stale
row and exits 1 if there is any, 0 if none.
Usage: python bench/check.py [BENCHMARKS.md]
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = re.compile(r"`?([0-9a-f]{7,40})`?\s+(\d{4}-\d{2}-\d{2})")


def rows(text):
    """(what, measured cell, covers cell) of each row of the first table with
    `measured` and `covers` columns."""
    header = None
    out = []
    for line in text.splitlines():
        if not line.startswith("|"):
            if header is not None and out:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            if "measured" in cells and "covers" in cells:
                header = {name: i for i, name in enumerate(cells)}
            continue
        if set(line.replace("|", "").strip()) <= {"-", " "}:
            continue
        picked = [
            cells[header[n]] if header[n] < len(cells) else ""
            for n in ("what", "measured", "covers")
        ]
        out.append(tuple(picked))
    return out


def changed(commit, paths):
    """Paths (of `paths`) changed between `commit` and HEAD, or None when the
    commit is not in this repository."""
    known = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True
    )
    if known.returncode != 0:
        return None
    out = subprocess.run(
        ["git", "diff", "--name-only", commit, "HEAD", "--", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [p for p in out.stdout.split() if p]


def stale(text):
    """[(what, why)] for every stale row."""
    found = []
    for what, measured, covers in rows(text):
        m = STAMP.search(measured)
        paths = [p.strip("`") for p in covers.split() if p.strip("`")]
        if m is None:
            found.append((what, "no `measured` stamp (commit and date)"))
            continue
        if not paths:
            found.append((what, "no `covers` paths"))
            continue
        diff = changed(m.group(1), paths)
        if diff is None:
            found.append((what, f"commit {m.group(1)} is not in this repository"))
        elif diff:
            shown = ", ".join(diff[:4]) + (f" and {len(diff) - 4} more" if len(diff) > 4 else "")
            found.append((what, f"changed since {m.group(1)}: {shown}"))
    return found


def main(argv):
    path = Path(argv[0]) if argv else ROOT / "BENCHMARKS.md"
    text = path.read_text()
    table = rows(text)
    if not table:
        print(f"{path}: no table with `measured` and `covers` columns", file=sys.stderr)
        return 2
    found = stale(text)
    for what, why in found:
        print(f"stale: {what[:90]}: {why}")
    print(f"{len(found)} of {len(table)} rows stale")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
