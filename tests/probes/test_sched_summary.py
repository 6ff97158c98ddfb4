"""Pool workers summarised in the kernel, step threads exact (bcc sched probe).

`summary_client.py` runs steps on its main thread while a worker that never
emits a span switches thousands of times a second. By default the worker is
summarised once the process has run steps for `sched_summary_after_ms`:
from then on it has `sched_summary` rows and no exact rows, and its exact
rows plus its summarised switches equal the kernel's own switch count for
it (/proc status, read by the thread itself). The step thread keeps an exact
offcpu row for every switch-out the kernel counted. With `--sched-detail`
nothing is summarised. Needs root and bcc (a failure in CI)."""

import json
import os
import subprocess
import sys

import pytest

from helpers.daemonproc import DaemonProcess
from helpers.privileged import require_privileged
from helpers.waiting import wait_for
from stallscope.probes.sched_bcc import BccSchedProbe

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "summary_client.py")


def _traced(tmp_path, extra_args, seconds):
    reason = BccSchedProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    daemon = DaemonProcess(
        tmp_path, sched_backend="bcc", extra_args=["--no-kernel-causes", *extra_args]
    ).start()
    client = subprocess.Popen(
        [sys.executable, CLIENT, daemon.socket, str(seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout.readline() == "connected\n"
        assert wait_for(lambda: f"pid {client.pid} uid" in daemon.read_log(), 30)
        client.stdin.write("\n")
        client.stdin.flush()
        out = json.loads(client.stdout.readline())
        assert client.wait(timeout=60) == 0
    finally:
        if client.poll() is None:
            client.kill()
        rc, _ = daemon.stop(timeout_s=60)
    assert rc == 0
    return daemon, out


def _switches(a, b):
    return (b["vol"] + b["inv"]) - (a["vol"] + a["inv"])


def _lost(daemon):
    """Switch-ins the kernel did not report (losses rows: never silent; more
    under concurrent tracing by other tools)."""
    return daemon.scalar("SELECT coalesce(sum(count), 0) FROM losses WHERE probe = 'sched'")


def _rows_between(daemon, tid, lo_ns, hi_ns, exact_only=True):
    return daemon.scalar(
        "SELECT count(*) FROM offcpu WHERE tid = ? AND start_ns > ? AND start_ns < ?"
        + (" AND resolution_ns IS NULL" if exact_only else ""),
        [tid, lo_ns, hi_ns],
    )


def _window_matches_kernel(daemon, tid, start, end, exact_only=True):
    """Every switch the kernel counted between the two /proc reads has a row
    (or a reported loss), and no more rows than switches are inside them.

    Each reading is bracketed by two clock reads (`ns_before`, `ns`) and the
    switch counters are read in between: a switch the two counts differ by
    falls inside the outer window [start.ns_before, end.ns], and a row
    inside the inner window [start.ns, end.ns_before] is a switch they count.
    Switches inside a reading itself (reading a task's status can switch it
    out, and a loaded machine can preempt it there any number of times) are
    in the outer window only, so no fixed allowance is needed: the bounds
    are exact."""
    switches = _switches(start, end)
    outer = _rows_between(daemon, tid, start["ns_before"], end["ns"], exact_only)
    inner = _rows_between(daemon, tid, start["ns"], end["ns_before"], exact_only)
    assert switches <= outer + _lost(daemon), (outer, switches, _lost(daemon))
    assert inner <= switches, (inner, switches)
    return outer


def _step_thread_is_exact(daemon, out):
    rows = _window_matches_kernel(daemon, out["step_tid"], out["step_start"], out["step_end"])
    assert rows > 100


def test_a_worker_without_spans_is_summarised_and_its_totals_are_exact(tmp_path):
    daemon, out = _traced(tmp_path, ["--sched-summary-after-ms", "500"], 3.0)
    worker = out["worker_tid"]
    _step_thread_is_exact(daemon, out)
    assert daemon.scalar("SELECT count(*) FROM sched_summary WHERE tid = ?", [out["step_tid"]]) == 0
    first_ns, n_rows, switches, preemptions, oncpu_ns, offcpu_ns = daemon.query(
        "SELECT min(start_ns), count(*), sum(switches), sum(preemptions), sum(oncpu_ns), "
        "sum(offcpu_ns) FROM sched_summary WHERE tid = ? AND pid = ?",
        [worker, out["pid"]],
    )[0]
    assert n_rows >= 10 and switches > 1000
    exact = daemon.scalar(
        "SELECT count(*) FROM offcpu WHERE tid = ? AND resolution_ns IS NULL", [worker]
    )
    # No exact row begins once the worker is summarised (one that began
    # before may end later: preempted for a while on a loaded machine),
    # while it lives. On its way out, after its last reading, one may: the
    # daemon releases a summarised thread once /proc no longer lists it,
    # which is before its final switch-out (1 run in ~60 had a 1.9 ms
    # preemption 96 us after the worker's last reading as an exact row).
    late = daemon.scalar(
        "SELECT count(*) FROM offcpu WHERE tid = ? AND start_ns > ? AND start_ns < ?",
        [worker, first_ns + 10**8, out["worker_end"]["ns"]],
    )
    assert late == 0
    # Every switch-out the kernel counted for the worker, once: exact rows
    # before it was summarised plus summarised switches after, and a few
    # more after its last reading, on its way out, that no count of its own
    # can see: the exit path can wait for the GIL (the probe's flusher wakes
    # every 100 ms and may hold it), the joiner's lock and the mm; 10 bounds
    # those few with room, and the lower bound is exact.
    counted = _switches({"vol": 0, "inv": 0}, out["worker_end"])
    seen = exact + switches
    assert counted <= seen + _lost(daemon) and seen <= counted + 10, (exact, switches, counted)
    assert preemptions <= out["worker_end"]["inv"] + 10
    oncpu_total = out["worker_end"]["oncpu_ns"] - out["worker_start"]["oncpu_ns"]
    # on-CPU time after its last reading (its exit) is in the summary too:
    # well under 20 ms of a thread that only sleeps
    assert 0 < oncpu_ns <= oncpu_total + 20_000_000
    assert offcpu_ns > 0
    # Far fewer rows than switches: the point of summarising.
    assert n_rows * 20 < switches


def test_sched_detail_keeps_every_thread_exact(tmp_path):
    daemon, out = _traced(tmp_path, ["--sched-detail", "--sched-summary-after-ms", "0"], 1.5)
    _step_thread_is_exact(daemon, out)
    assert daemon.scalar("SELECT count(*) FROM sched_summary") == 0
    rows = _window_matches_kernel(
        daemon, out["worker_tid"], out["worker_start"], out["worker_end"], exact_only=False
    )
    assert rows > 1000
