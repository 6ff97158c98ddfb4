"""`stallscope run --no-client`: a command traced with nothing injected.

The command is Debian's /usr/bin/python3 (built with CPython's USDT
markers); the running daemon is asked to follow its pid once it runs the
interpreter, while the command is held at its exec. So every GC pass of
the interpreter is stored: the passes that end before the script's last
gc.get_stats() read equal that read's counts per generation, from the
interpreter's first pass on, with the collector paused around each read.
The exit status, a signal and stdout pass through; the run ends
(`ended_ns`) when the process exits. Needs root and bcc (a failure in CI
with STALLSCOPE_REQUIRE_PRIVILEGED=1)."""

import json
import os
import signal
import subprocess
import sys

import pytest

from helpers.privileged import is_root, require_privileged
from helpers.run import stallscope_run, write_script
from helpers.waiting import wait_for

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

SYSTEM_PYTHON = "/usr/bin/python3"

COUNTING = """
    import gc, json, os, sys, time

    def edge():
        gc.disable()
        try:
            return time.monotonic_ns(), [s["collections"] for s in gc.get_stats()]
        finally:
            gc.enable()

    t0, s0 = edge()
    for i in range(30):
        gc.collect(i % 3)
    keep = []
    for i in range(200000):  # allocation-triggered passes too
        d = {}
        d["self"] = d
        keep.append(d)
        if i % 50000 == 0:
            del keep[:]
    t1, s1 = edge()
    print(json.dumps({
        "window": [t0, t1], "before": s0, "after": s1,
        "injected": "probe_client" in sys.modules or "PYTHONPATH" in os.environ,
        "pid": os.getpid(),
    }), flush=True)
    sys.exit(7)
"""


def _bcc_usable():
    try:
        import bcc  # noqa: F401
    except ImportError:
        return False
    return is_root()


def _needs_usdt():
    require_privileged(_bcc_usable(), "requires root and bcc")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("needs the distribution's /usr/bin/python3 (built with USDT markers)")


def _env():
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_every_pass_from_the_interpreters_start_is_stored_and_the_status_passes(daemon, tmp_path):
    _needs_usdt()
    script = write_script(tmp_path, "counting.py", COUNTING)
    done = stallscope_run(
        ["--no-client", "--socket", daemon.socket, "--", SYSTEM_PYTHON, script], cwd=tmp_path
    )
    assert done.returncode == 7, done.stderr
    summary = json.loads(done.stdout)
    assert not summary["injected"]
    assert "warning" not in done.stderr, done.stderr
    assert wait_for(lambda: f"gc probe: pid {summary['pid']} exited" in daemon.read_log(), 30)
    daemon.stop()
    ((run_id, label, pid, ended_ns, argv),) = daemon.query(
        "SELECT run_id, label, pid, ended_ns, argv FROM runs"
    )
    assert label == "counting.py" and pid == summary["pid"] and argv == [SYSTEM_PYTHON, script]
    start_ns, end_ns = summary["window"]
    assert ended_ns is not None and ended_ns > end_ns

    def stored(where, *params):
        rows = dict(
            daemon.query(
                f"SELECT generation, count(*) FROM gc_events WHERE run_id = ? AND {where} "
                "GROUP BY generation",
                [run_id, *params],
            )
        )
        return [rows.get(g, 0) for g in range(3)]

    # From the interpreter's first pass: nothing ran before the markers were live.
    assert stored("end_ns < ?", end_ns) == summary["after"]
    window = [b - a for a, b in zip(summary["before"], summary["after"], strict=True)]
    assert stored("start_ns > ? AND end_ns < ?", start_ns, end_ns) == window
    assert window[2] >= 10
    ((state, detail),) = daemon.query(
        "SELECT state, detail FROM probe_status WHERE probe = 'gc' ORDER BY ts_ns DESC LIMIT 1"
    )
    assert state == "active" and f"pid {pid}: run {run_id}" in detail


WAITING = """
    import gc, signal, sys
    gc.collect()
    print("ready", flush=True)
    signal.pause()
"""


def test_a_signal_reaches_the_command_through_a_launcher_and_the_run_ends(daemon, tmp_path):
    _needs_usdt()
    script = write_script(tmp_path, "waiting.py", WAITING)
    # `env` first: the first exec's image has no markers, the second is the interpreter.
    command = ["/usr/bin/env", SYSTEM_PYTHON, script]
    proc = subprocess.Popen(
        [sys.executable, "-m", "stallscope.cli", "run", "--no-client", "--label", "waiting"]
        + ["--socket", daemon.socket, "--", *command],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)  # to the wrapper's pid: the command is that process
        assert proc.wait(timeout=30) == -signal.SIGTERM
        assert "warning" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_for(lambda: f"gc probe: pid {proc.pid} exited" in daemon.read_log(), 30)
    daemon.stop()
    ((run_id, pid, ended_ns),) = daemon.query("SELECT run_id, pid, ended_ns FROM runs")
    assert pid == proc.pid and ended_ns is not None
    assert (
        daemon.scalar(
            "SELECT count(*) FROM gc_events WHERE run_id = ? AND generation = 2", [run_id]
        )
        >= 1
    )
    assert daemon.query("SELECT label FROM runs") == [("waiting",)]


def test_an_absent_daemon_is_a_warning(tmp_path):
    script = write_script(tmp_path, "quick.py", "print('hi')\nraise SystemExit(4)\n")
    missing = str(tmp_path / "no-daemon.sock")
    done = stallscope_run(
        ["--no-client", "--socket", missing, "--", SYSTEM_PYTHON, script], tmp_path
    )
    assert done.returncode == 4 and done.stdout == "hi\n"
    assert done.stderr.count(f"warning: no daemon at {missing}") == 1


def test_an_interpreter_without_markers_is_named_and_still_runs(daemon, tmp_path):
    _needs_usdt()
    script = write_script(tmp_path, "quick.py", "print('hi')\nraise SystemExit(5)\n")
    done = stallscope_run(
        ["--no-client", "--socket", daemon.socket, "--", sys.executable, script], tmp_path
    )
    assert done.returncode == 5 and done.stdout == "hi\n"
    if "warning" not in done.stderr:
        pytest.skip(f"{sys.executable} has the USDT markers: nothing to refuse here")
    assert "has no USDT probe gc__start" in done.stderr
    daemon.stop()
    assert daemon.query("SELECT count(*) FROM runs") == [(0,)]


def test_watch_requests_the_daemon_refuses(daemon, tmp_path):
    _needs_usdt()
    from stallscope.cli.run_noclient import ask_daemon

    ok, reason = ask_daemon(daemon.socket, 1 << 21, "nobody")
    assert not ok and reason == f"no process {1 << 21}"
    # A process without markers: refused with the probe's reason, recorded once.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ok, reason = ask_daemon(daemon.socket, proc.pid, "venv-python")
    finally:
        proc.kill()
        proc.wait()
    if ok:
        pytest.skip(f"{sys.executable} has the USDT markers: nothing to refuse here")
    assert "no USDT probe gc__start" in reason
    daemon.stop()
    assert daemon.query("SELECT count(*) FROM runs") == [(0,)]
    ((detail,),) = daemon.query(
        "SELECT detail FROM probe_status WHERE probe = 'gc' AND state = 'unavailable'"
    )
    assert f"pid {proc.pid}" in detail
