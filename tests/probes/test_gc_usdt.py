"""GC from outside: `stallscope daemon --pid PID` records every GC pass of a
process that imports nothing of ours, through CPython's USDT markers.

The traced process is Debian's /usr/bin/python3 (built with the markers).
It reads the gc module's own counters around a window with the collector
paused at both edges, so the passes stored in that window must equal its
gc.get_stats() deltas per generation, exactly. An interpreter without the
markers (pyenv's) gets a one-line reason in probe_status. Needs root and
bcc (a failure in CI)."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from helpers.daemonproc import DaemonProcess
from helpers.privileged import is_root, require_privileged

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

SYSTEM_PYTHON = "/usr/bin/python3"

CHILD = textwrap.dedent(
    """
    import gc, json, sys, time

    def edge():
        gc.disable()
        try:
            return time.monotonic_ns(), [s["collections"] for s in gc.get_stats()]
        finally:
            gc.enable()

    print("ready", flush=True)
    sys.stdin.readline()
    t0, s0 = edge()
    for i in range(30):
        gc.collect(i % 3)
    keep = []
    for i in range(300000):  # allocation-triggered passes of every generation
        d = {}
        d["self"] = d
        keep.append(d)
        if i % 60000 == 0:
            del keep[:]
    t1, s1 = edge()
    print(json.dumps({"window": [t0, t1], "passes": [b - a for a, b in zip(s0, s1)]}), flush=True)
    sys.stdin.readline()
    """
)


def _bcc_usable():
    try:
        import bcc  # noqa: F401
    except ImportError:
        return False
    return is_root()


def _wait_for(daemon, text, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in daemon.read_log():
            return
        if daemon.proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"daemon never logged {text!r}:\n{daemon.read_log()}")


def _child(python, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen(
        [python, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_client_less_gc_equals_the_processs_own_counts(tmp_path):
    require_privileged(_bcc_usable(), "requires root and bcc")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("needs the distribution's /usr/bin/python3 (built with USDT markers)")
    child = _child(SYSTEM_PYTHON, tmp_path)
    daemon = DaemonProcess(tmp_path, extra_args=["--pid", str(child.pid)])
    try:
        daemon.start()
        _wait_for(daemon, f"gc probe: following pid {child.pid}")
        child.stdin.write("\n")
        child.stdin.flush()
        summary = json.loads(child.stdout.readline())
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0
        _wait_for(daemon, f"gc probe: pid {child.pid} exited")
    finally:
        if child.poll() is None:
            child.kill()
        daemon.stop()
    (run_id, label, pid, ended_ns), *more = daemon.query(
        "SELECT run_id, label, pid, ended_ns FROM runs"
    )
    assert not more and pid == child.pid and "child.py" in label
    start_ns, end_ns = summary["window"]
    assert ended_ns is not None and ended_ns > end_ns  # set when the process exited
    stored = dict(
        daemon.query(
            "SELECT generation, count(*) FROM gc_events WHERE run_id = ? "
            "AND start_ns > ? AND end_ns < ? GROUP BY generation",
            [run_id, start_ns, end_ns],
        )
    )
    assert [stored.get(g, 0) for g in range(3)] == summary["passes"]
    assert summary["passes"][2] >= 10
    (state, detail), *_ = daemon.query(
        "SELECT state, detail FROM probe_status WHERE probe = 'gc' ORDER BY ts_ns DESC"
    )
    assert state == "active" and f"pid {child.pid}" in detail


def test_an_interpreter_without_markers_gets_a_reason(tmp_path):
    require_privileged(_bcc_usable(), "requires root and bcc")
    child = _child(sys.executable, tmp_path)  # the venv's Python: pyenv-built here
    daemon = DaemonProcess(tmp_path, extra_args=["--pid", str(child.pid)])
    try:
        daemon.start()
        _wait_for(daemon, f"gc probe: pid {child.pid}:")
    finally:
        child.kill()
        child.wait()
        daemon.stop()
    rows = daemon.query("SELECT state, detail FROM probe_status WHERE probe = 'gc'")
    if any(state == "active" for state, _ in rows):
        pytest.skip(f"{sys.executable} has the USDT markers: nothing to refuse here")
    ((state, detail),) = rows
    assert state == "unavailable"
    assert f"pid {child.pid}" in detail and "no USDT probe gc__start" in detail
    assert daemon.query("SELECT count(*) FROM runs") == [(0,)]


HANDOVER = textwrap.dedent(
    """
    import gc, importlib.util, json, os, sys, time

    def collect(n):
        for i in range(n):
            gc.collect(i % 3)

    print("ready", flush=True)
    sys.stdin.readline()
    collect(12)  # seen by USDT only
    pkg = sys.argv[1]
    spec = importlib.util.spec_from_file_location(
        "probe_client", os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["probe_client"] = module
    spec.loader.exec_module(module)
    probe = module.connect(socket_path=sys.argv[2], run_label="late-client")
    print("connected", flush=True)
    sys.stdin.readline()  # the daemon has handled the connection
    t0 = time.monotonic_ns()
    collect(9)  # seen by the client only
    t1 = time.monotonic_ns()
    probe.close()
    print(json.dumps([t0, t1]), flush=True)
    sys.stdin.readline()
    """
)


def test_a_client_connecting_later_takes_over_and_passes_are_not_doubled(tmp_path):
    require_privileged(_bcc_usable(), "requires root and bcc")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("needs the distribution's /usr/bin/python3 (built with USDT markers)")
    import probe_client

    script = tmp_path / "handover.py"
    script.write_text(HANDOVER)
    daemon = DaemonProcess(tmp_path)
    pkg = os.path.dirname(os.path.abspath(probe_client.__file__))
    child = subprocess.Popen(
        [SYSTEM_PYTHON, str(script), pkg, daemon.socket],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline() == "ready\n"
        daemon.extra_args = ["--pid", str(child.pid)]
        daemon.start()
        _wait_for(daemon, f"gc probe: following pid {child.pid}")
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == "connected\n"
        _wait_for(daemon, f"gc probe: pid {child.pid} connected a probe client")
        child.stdin.write("\n")
        child.stdin.flush()
        start_ns, end_ns = json.loads(child.stdout.readline())
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
        daemon.stop()
    rows = dict(
        daemon.query(
            "SELECT r.label = 'late-client', count(*) FROM gc_events g JOIN runs r USING (run_id) "
            "WHERE g.start_ns > ? AND g.end_ns < ? AND g.generation = 2 GROUP BY ALL",
            [start_ns, end_ns],
        )
    )
    # The 3 explicit gen-2 passes after the handover: the client's, once.
    assert rows == {True: 3}
    usdt_before = daemon.scalar(
        "SELECT count(*) FROM gc_events g JOIN runs r USING (run_id) "
        "WHERE r.label <> 'late-client' AND g.generation = 2"
    )
    assert usdt_before >= 4  # collect(12): passes of gen 2 seen from outside
