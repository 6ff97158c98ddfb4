"""The probe client's own tests on every supported interpreter (make test-pythons).

The client is stdlib only and runs inside the engine, on whatever CPython
3.10-3.13 the engine uses; the daemon runs on the main venv's. So for each
interpreter found (helpers/pythons.py) this runs the client's tests, from
that interpreter's venv, against daemons started from the main venv
(STALLSCOPE_DAEMON_PYTHON): the hot-path rules (no tracked object, no cycle,
both record writes), every attach shape, the GC ring, the C record write
built for that interpreter (byte-identical to the Python one, declining
where unsure; `stallscope run` reporting which one a run used), and the
reconnect to a busy daemon. A missing interpreter or venv is a skip, or a
failure under STALLSCOPE_REQUIRE_PYTHONS=1 (CI). The interpreter this
suite itself runs on (the main venv's) runs those files as part of it, so
it is not run twice.

The interpreters run two at a time (2 cores here): their tests count
objects and records in their own processes and assert no timing, so
sharing the CPU cannot change what they see.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import pythons

pytestmark = pytest.mark.daemon

CLIENT_TESTS = (
    "tests/spine/test_probe_gc_rules.py",
    "tests/spine/test_attach_shapes.py",
    "tests/spine/test_gc_ring.py",
    "tests/spine/test_accel.py",
    "tests/spine/test_connect_busy.py",
    "tests/spine/test_request_gc_rules.py",
)
SLOTS = (*pythons.SUPPORTED_MINORS, "debian")
AT_ONCE = 2


def _this_interpreter():
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _run(py):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(pythons.REPO), str(pythons.REPO / "daemon")]),
        STALLSCOPE_DAEMON_PYTHON=sys.executable,
        # the bootstrap built the C write for this interpreter: its tests
        # must run, not skip
        STALLSCOPE_REQUIRE_ACCEL="1",
    )
    return subprocess.run(
        [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CLIENT_TESTS],
        cwd=pythons.REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def results():
    """{venv name: CompletedProcess} for every interpreter of every slot
    that has its venv (the tests below say what is missing)."""
    this = _this_interpreter()
    todo = [
        (name, py)
        for slot in SLOTS
        for name in pythons.matrix(slot)
        if os.path.realpath(pythons.interpreter(name)) != this and (py := pythons.venv_python(name))
    ]
    with ThreadPoolExecutor(AT_ONCE) as pool:
        done = dict(zip([n for n, _ in todo], pool.map(_run, [p for _, p in todo]), strict=True))
    return done


@pytest.mark.parametrize("slot", SLOTS)
def test_client_tests_pass_on(slot, results):
    names = pythons.matrix(slot)
    where = "Debian's /usr/bin/python3" if slot == "debian" else f"pyenv {slot}.*"
    pythons.require_python(names, f"no {where} on this machine")
    for name in names:
        if os.path.realpath(pythons.interpreter(name)) == _this_interpreter():
            print(f"{name}: the suite's own interpreter (these files run in it)")
            continue
        pythons.require_python(
            pythons.venv_python(name), f"no venv for {name}: run scripts/bootstrap.sh"
        )
        done = results[name]
        tail = done.stdout.strip().splitlines()[-1:] or [done.stderr[-2000:]]
        print(f"{name}: {tail[0]}")
        assert done.returncode == 0, f"{name}:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
        assert " passed" in tail[0] and "skipped" not in tail[0], f"{name}: {tail[0]}"
