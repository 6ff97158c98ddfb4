"""The CPython interpreters the tests use besides their own, as found on this machine.

Two users, one rule. The probe client supports CPython 3.10 to 3.13
(README): its own tests run on every pyenv 3.10-3.13 found and on Debian's
/usr/bin/python3 (built with USDT markers), each from a small venv that
scripts/bootstrap.sh prepares under `.venv-pythons/` (pytest, and the C
record write built for it; `matrix`, `venv_python`, tests/pythons/). The CPU
sampler's tests trace engines on those interpreters (`interpreters`,
`pyenv_python`). A missing interpreter or venv is a skip, or a failure
under STALLSCOPE_REQUIRE_PYTHONS=1 (set in CI, where all of them are
installed), the rule of `privileged.py`: `require(path, what)` and
`require_python(ok, reason)` apply it.
"""

import glob
import os
import subprocess
from pathlib import Path

import pytest

REQUIRE_PYTHONS = os.environ.get("STALLSCOPE_REQUIRE_PYTHONS") == "1"
SYSTEM_PYTHON = "/usr/bin/python3"
SUPPORTED_MINORS = ("3.10", "3.11", "3.12", "3.13")
REPO = Path(__file__).resolve().parents[2]
VENVS = REPO / ".venv-pythons"
DEBIAN_VENV = "debian-python3"  # the matrix venv of SYSTEM_PYTHON


def pyenv_root():
    root = os.environ.get("PYENV_ROOT")
    if root:
        return root
    try:
        out = subprocess.run(["pyenv", "root"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return os.path.expanduser("~/.pyenv")


def pyenv_python(prefix):
    """The newest pyenv interpreter whose version starts with `prefix`
    ("3.12", "3.9.18"), or None."""
    found = sorted(glob.glob(os.path.join(pyenv_root(), "versions", f"{prefix}*", "bin", "python")))
    found = [p for p in found if os.access(p, os.X_OK) and "t/bin" not in p]  # no 3.13t
    return found[-1] if found else None


def interpreters():
    """[(label, path or None)]: the system interpreter, then one per supported minor."""
    out = [("debian", SYSTEM_PYTHON if os.access(SYSTEM_PYTHON, os.X_OK) else None)]
    out += [(minor, pyenv_python(minor + ".")) for minor in SUPPORTED_MINORS]
    return out


def require(path, what):
    """Skip (or, under STALLSCOPE_REQUIRE_PYTHONS=1, fail) unless `path` exists."""
    if path and os.access(path, os.X_OK):
        return path
    reason = f"{what} not installed (pyenv install it, or set STALLSCOPE_REQUIRE_PYTHONS=0)"
    if REQUIRE_PYTHONS:
        pytest.fail(f"required in CI but unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


def require_python(ok, reason):
    """Skip (or, under STALLSCOPE_REQUIRE_PYTHONS=1, fail) unless `ok`."""
    if ok:
        return
    if REQUIRE_PYTHONS:
        pytest.fail(f"required (STALLSCOPE_REQUIRE_PYTHONS=1) but missing: {reason}", pytrace=False)
    pytest.skip(reason)


# -- the probe client's interpreter matrix (tests/pythons/) ----------------------


def pyenv_versions(prefix):
    """Names of pyenv's installed versions that start with `prefix` + '.'
    (e.g. '3.10' -> ['3.10.13']), each with a python3."""
    versions = Path(pyenv_root()) / "versions"
    if not versions.is_dir():
        return []
    return sorted(
        p.name
        for p in versions.iterdir()
        if p.name.startswith(prefix + ".") and (p / "bin" / "python3").exists()
    )


def interpreter(name):
    """The interpreter behind a matrix venv name."""
    if name == DEBIAN_VENV:
        return SYSTEM_PYTHON
    return str(Path(pyenv_root()) / "versions" / name / "bin" / "python3")


def matrix(slot):
    """The venv names of one slot of the matrix: a minor version ('3.12') or
    'debian'."""
    if slot == "debian":
        return [DEBIAN_VENV] if os.path.exists(SYSTEM_PYTHON) else []
    return pyenv_versions(slot)


def venv_python(name):
    """The matrix venv's python, or None if the bootstrap did not make it."""
    py = VENVS / name / "bin" / "python"
    return str(py) if (VENVS / name / ".stallscope-ready").exists() and py.exists() else None
