"""The interpreters the probe client supports, as found on this machine.

The client supports CPython 3.10 to 3.13 (README). Its tests run on each
minor version pyenv has (`$(pyenv root)/versions/3.1[0-3].*`) and on
Debian's `/usr/bin/python3` (built with USDT markers), each from a small
venv that scripts/bootstrap.sh prepares under `.venv-pythons/` (pytest, and
the C record write built for it). `require_python(ok, reason)` skips when an
interpreter or its venv is missing, and fails instead under
STALLSCOPE_REQUIRE_PYTHONS=1 (.ci/run sets it).
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENVS = REPO / ".venv-pythons"
SUPPORTED = ("3.10", "3.11", "3.12", "3.13")
DEBIAN = "/usr/bin/python3"
REQUIRE = os.environ.get("STALLSCOPE_REQUIRE_PYTHONS") == "1"


def pyenv_root():
    root = os.environ.get("PYENV_ROOT")
    if root:
        return Path(root)
    if shutil.which("pyenv"):
        out = subprocess.run(["pyenv", "root"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return Path(out.stdout.strip())
    return Path.home() / ".pyenv"


def pyenv_versions(prefix):
    """Names of pyenv's installed versions that start with `prefix` + '.'
    (e.g. '3.10' -> ['3.10.13']), each with a python3."""
    versions = pyenv_root() / "versions"
    if not versions.is_dir():
        return []
    return sorted(
        p.name
        for p in versions.iterdir()
        if p.name.startswith(prefix + ".") and (p / "bin" / "python3").exists()
    )


def interpreter(name):
    """The interpreter behind a matrix venv name."""
    return (
        DEBIAN
        if name == "debian-python3"
        else str(pyenv_root() / "versions" / name / "bin" / "python3")
    )


def matrix(slot):
    """The venv names of one slot of the matrix: a minor version ('3.12') or
    'debian'."""
    if slot == "debian":
        return ["debian-python3"] if os.path.exists(DEBIAN) else []
    return pyenv_versions(slot)


def venv_python(name):
    """The matrix venv's python, or None if the bootstrap did not make it."""
    py = VENVS / name / "bin" / "python"
    return str(py) if (VENVS / name / ".stallscope-ready").exists() and py.exists() else None


def require_python(ok, reason):
    """Skip (or, with STALLSCOPE_REQUIRE_PYTHONS=1, fail) unless `ok`."""
    if ok:
        return
    if REQUIRE:
        pytest.fail(f"required (STALLSCOPE_REQUIRE_PYTHONS=1) but missing: {reason}", pytrace=False)
    pytest.skip(reason)
