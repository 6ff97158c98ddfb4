"""The interpreters a traced engine runs on in the tests that need several.

`interpreters()` lists Debian's /usr/bin/python3 and every pyenv CPython
3.10-3.13 found under `$(pyenv root)/versions` (or ~/.pyenv); `require(path,
what)` skips a test whose interpreter is missing, or fails it under
STALLSCOPE_REQUIRE_PYTHONS=1 (set in CI, where all of them are installed),
the rule of `privileged.py`.
"""

import glob
import os
import subprocess

import pytest

REQUIRE_PYTHONS = os.environ.get("STALLSCOPE_REQUIRE_PYTHONS") == "1"
SYSTEM_PYTHON = "/usr/bin/python3"
SUPPORTED_MINORS = ("3.10", "3.11", "3.12", "3.13")


def pyenv_root():
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
