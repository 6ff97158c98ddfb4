"""`stallscope stacks PID` against a real daemon (root) and an engine of uid nobody.

The daemon binds its probe socket as it always does (mode 0660, group
stallscope). The engine (tests/hang/hang_engine.py, mode lock: its step
thread waits on a lock held by a thread blocked reading a pipe) runs as
uid nobody with the group stallscope, so that it may connect. Then the
command runs as root, as the owner (nobody, with the group), as another
user who may connect (uid 1, with the group): refused with
PERMISSION_DENIED, and as a user without the group: the socket itself
refuses, and the message says which group to join. A process the daemon
does not trace, and one that does not exist, are NOT_FOUND; a flood of
requests from one user is cut off with RESOURCE_EXHAUSTED. The engine
is never ptraced (TracerPid 0 throughout) and keeps its threads' states.
"""

import grp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers.daemonproc import DaemonProcess
from helpers.privileged import is_root, require_privileged
from stallscope.probes import hang_proc

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENGINE = os.path.join(ROOT, "tests", "hang", "hang_engine.py")
CLI = os.path.join(os.path.dirname(sys.executable), "stallscope")
PYTHON = "/usr/bin/python3"  # readable by nobody
NOBODY, OTHER = 65534, 1  # uid 1: Debian's "daemon", not the engine's owner


def _group():
    try:
        return grp.getgrnam("stallscope").gr_gid
    except KeyError:
        return None


def as_user(uid, gid, groups):
    """setpriv's prefix: run as `uid` with exactly `groups` (empty: none)."""
    extra = [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", *extra, "--"]


def stacks(sock, pid, prefix=()):
    return subprocess.run(
        [*prefix, CLI, "stacks", str(pid), "--socket", sock, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )


@pytest.fixture(scope="module")
def setup(request):
    group = _group()
    require_privileged(
        is_root() and shutil.which("setpriv") and group is not None,
        "requires root, setpriv (util-linux) and the group stallscope (make bootstrap)",
    )
    # pytest's tmp dirs are 0700 (root's): the engine of uid nobody needs a path to the socket
    folder = Path(tempfile.mkdtemp(prefix="stallscope-stacks-", dir="/tmp"))
    os.chmod(folder, 0o755)
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    daemon = DaemonProcess(folder)
    daemon.start(timeout_s=90)
    request.addfinalizer(daemon.stop)
    mode = os.stat(daemon.socket)
    env = {**os.environ, "PYTHONPATH": ROOT}
    eng = subprocess.Popen(
        [*as_user(NOBODY, NOBODY, [group]), PYTHON, ENGINE, daemon.socket, "lock"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd="/",
    )
    request.addfinalizer(lambda: (eng.kill(), eng.wait(10)))
    events = {}
    while "hanging" not in events:
        line = eng.stdout.readline()
        assert line, f"engine exited: {eng.poll()}"
        ev = json.loads(line)
        events[ev["event"]] = ev
    pid = events["ready"]["pid"]
    # the thread list reaches the daemon every 0.5 s (the client's default)
    time.sleep(1.5)
    return daemon, pid, group, mode


def _threads(answer):
    return {t["name"]: t for t in answer["threads"]}


def _functions(thread):
    return [f[1] for f in thread["frames"]]


def test_the_socket_is_as_the_daemon_sets_it(setup):
    _, _, group, mode = setup
    assert oct(mode.st_mode & 0o777) == "0o660" and mode.st_gid == group


def test_root_gets_every_threads_stacks_and_the_engine_runs_on(setup):
    daemon, pid, _, _ = setup
    out = stacks(daemon.socket, pid)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["pid"] == pid, answer
    # no CPU sampler here: every thread is read through /proc/PID/mem, and it says so
    assert answer["lacks"] == "no CPU sampler: no native leaf for running threads", answer
    got = _threads(answer)
    step, holder = got["engine-step"], got["holder"]
    assert step["state"] == "S" and step["source"] == "proc_mem", step
    assert _functions(step)[:2] == ["wait_for_lock", "step_thread"], step
    assert _functions(holder)[0] == "holder_reads_pipe", holder
    assert holder["syscall"] == 0, holder  # read(2)
    for t in answer["threads"]:  # frames only: file, function, line
        assert all(len(f) == 3 for f in t["frames"]), t
    assert hang_proc.tracer_pid(pid) == 0
    text = subprocess.run(
        [CLI, "stacks", str(pid), "--socket", daemon.socket], capture_output=True, text=True
    )
    assert text.returncode == 0, text.stderr
    assert "wait_for_lock" in text.stdout and "'holder' state S" in text.stdout, text.stdout


def test_the_owner_gets_them_too(setup):
    daemon, pid, group, _ = setup
    out = stacks(daemon.socket, pid, as_user(NOBODY, NOBODY, [group]))
    assert out.returncode == 0, out.stderr
    got = _threads(json.loads(out.stdout))
    assert "wait_for_lock" in _functions(got["engine-step"]), got


def test_another_user_is_refused(setup):
    daemon, pid, group, _ = setup
    out = stacks(daemon.socket, pid, as_user(OTHER, OTHER, [group]))
    assert out.returncode == 2 and out.stdout == "", out
    assert "PERMISSION_DENIED" in out.stderr and f"belongs to uid {NOBODY}" in out.stderr, out
    assert "refused the stacks of pid" in daemon.read_log()


def test_a_user_outside_the_group_cannot_connect(setup):
    daemon, pid, _, _ = setup
    out = stacks(daemon.socket, pid, as_user(OTHER, OTHER, []))
    assert out.returncode == 2, out
    assert "Permission denied" in out.stderr and "group stallscope" in out.stderr, out.stderr


def test_untraced_and_missing_processes_are_not_found(setup):
    daemon, _, _, _ = setup
    out = stacks(daemon.socket, os.getpid())  # this test's own process: not traced
    assert out.returncode == 2 and "NOT_FOUND" in out.stderr, out
    assert "not traced by this daemon" in out.stderr, out.stderr
    gone = subprocess.Popen(["true"])
    gone.wait()
    out = stacks(daemon.socket, gone.pid)
    assert out.returncode == 2 and f"NOT_FOUND: no process {gone.pid}" in out.stderr, out


def test_a_flood_of_requests_is_rate_limited(setup):
    daemon, pid, group, _ = setup
    flood = (
        "import json, sys\n"
        "from stallscope.cli.profile import ask_stacks, StacksRefused\n"
        "codes = []\n"
        "for _ in range(20):\n"
        "    try:\n"
        "        ask_stacks(sys.argv[1], int(sys.argv[2]))\n"
        "        codes.append('OK')\n"
        "    except StacksRefused as exc:\n"
        "        codes.append(exc.code)\n"
        "print(json.dumps(codes))\n"
    )
    out = subprocess.run(
        [*as_user(2, 2, [group]), sys.executable, "-c", flood, daemon.socket, str(pid)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert out.returncode == 0, out.stderr
    codes = json.loads(out.stdout)
    # uid 2 does not own the engine: refused, until its requests run out
    assert set(codes) == {"PERMISSION_DENIED", "RESOURCE_EXHAUSTED"}, codes
    assert codes[:5] == ["PERMISSION_DENIED"] * 5, codes
