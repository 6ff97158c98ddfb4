"""`make bench-check` (bench/check.py) lists exactly the BENCHMARKS.md rows
whose covered paths changed since the commit they were measured at."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "bench" / "check.py"


def git(cwd, *args):
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_rows_whose_paths_changed_are_listed(tmp_path):
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    (repo / "bench" / "a.py").write_text("a = 1\n")
    (repo / "bench" / "b.py").write_text("b = 1\n")
    (repo / "bench" / "check.py").write_text(CHECK.read_text())
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "one")
    first = git(repo, "rev-parse", "--short", "HEAD")
    (repo / "bench" / "b.py").write_text("b = 2\n")
    git(repo, "commit", "-qam", "two")
    (repo / "BENCHMARKS.md").write_text(
        "| what | target | result | command | measured | covers |\n"
        "|---|---|---|---|---|---|\n"
        f"| row a | - | 1 | `bench/a.py` | `{first}` 2026-12-01 | `bench/a.py` |\n"
        f"| row b | - | 2 | `bench/b.py` | `{first}` 2026-12-01 | `bench/b.py` |\n"
        "| row c | - | 3 | `bench/a.py` | | `bench/a.py` |\n"
        "| row d | - | 4 | `bench/a.py` | `deadbee` 2026-12-01 | `bench/a.py` |\n"
        f"| row e | - | 5 | `bench/a.py` | `{first}` 2026-12-01 | `bench` `:!bench/b.py` |\n"
        f"| row f | - | 6 | `bench/a.py` | `{first}` 2026-12-01 | `bench` `:!bench/a.py` |\n"
    )
    out = subprocess.run(
        [sys.executable, str(repo / "bench" / "check.py")], capture_output=True, text=True
    )
    assert out.returncode == 1, out
    lines = out.stdout.splitlines()
    assert not any("row a" in ln for ln in lines), lines
    assert any("row b" in ln and "bench/b.py" in ln for ln in lines), lines
    assert any("row c" in ln and "no `measured` stamp" in ln for ln in lines), lines
    assert any("row d" in ln and "not in this repository" in ln for ln in lines), lines
    assert not any("row e" in ln for ln in lines), lines  # its one change is left out
    assert any("row f" in ln and "bench/b.py" in ln for ln in lines), lines
    assert lines[-1] == "4 of 6 rows stale"
