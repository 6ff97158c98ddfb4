"""The tracer is not the noise: the daemon's threads run at the priority their
role says, keep off a pinned engine's CPU, do not preempt the engine, and
under a CPU hog lose nothing unreported and catch up afterwards.

Every case runs a real daemon (bcc scheduling probe: root in CI) and reads
the kernel's own data: each daemon thread's policy from /proc, the engine
thread's involuntary switches from /proc, and who preempted it from the
scheduling probe's rows (`offcpu.preemptor_pid`).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers.daemonproc import DaemonProcess
from helpers.faults import reconcile
from helpers.privileged import require_privileged
from helpers.tasks import task_field
from helpers.waiting import wait_for

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = os.path.join(os.path.dirname(HERE), "helpers", "observer_engine.py")
CPUS = sorted(os.sched_getaffinity(0))
IDLE, BATCH, OTHER = "5", "3", "0"  # /proc/TID/sched `policy` values


class NoNiceDaemon(DaemonProcess):
    """A daemon without CAP_SYS_NICE (and RLIMIT_NICE 0, the default), as an
    unprivileged service without LimitNICE= runs: it cannot raise a thread
    that fell behind back to normal priority."""

    def command(self):
        return ["capsh", "--drop=cap_sys_nice", "--", "-c", 'exec "$0" "$@"', *super().command()]


def bcc_daemon(tmp_path, extra=(), cls=DaemonProcess):
    from stallscope.probes.sched_bcc import BccSchedProbe

    reason = BccSchedProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    return cls(tmp_path, sched_backend="bcc", extra_args=list(extra)).start()


def policies(pid):
    """{tid: (comm, policy)} of every thread of `pid`."""
    return task_field(pid, "sched", "policy")


def run_engine(sock, seconds, step_ms, pin, busy, rate=200):
    out = subprocess.run(
        [sys.executable, ENGINE, sock, str(seconds), str(rate), str(step_ms), pin, busy],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def preempted_by(d, engine, pid):
    """Preemptions of the step thread inside its window by `pid`'s threads."""
    lo, hi = engine["window_ns"]
    return d.query(
        "SELECT preemptor_comm, count(*) FROM offcpu WHERE tid = ? AND preempted "
        "AND preemptor_pid = ? AND start_ns >= ? AND start_ns < ? GROUP BY ALL",
        [engine["tid"], pid, lo, hi],
    )


def test_every_daemon_thread_runs_at_the_priority_of_its_role(tmp_path):
    """Every thread, ours or a library's (DuckDB, Arrow), runs at idle
    priority, except what answers a waiting client (the API's handlers, its
    poller and its query pool: batch) and the hang watchdog (batch: a hung
    engine may spin on every CPU) and the probe socket's reader (the main
    thread) while no client is connected (the next one's HELLO must be read
    at once, docs/footprint.md); DuckDB starts no thread of its own."""
    d = bcc_daemon(tmp_path, ["--api-socket", str(tmp_path / "api.sock")])
    try:
        from stallscope.api.client import Client

        client = Client(str(tmp_path / "api.sock"))
        client.wait_ready()
        assert client.query("SELECT count(*) FROM runs")[1] == [(0,)]  # the query pool exists
        client.close()

        def serving(comm):
            # What answers a waiting client: the query pool that ran the
            # query above, gRPC's handlers and its poller (stallscope/api*);
            # and the hang watchdog, which keeps pace (docs/footprint.md).
            return comm.startswith("stallscope/api") or comm == "stallscope/hang"

        def others():  # threads not at the priority of their role
            return {
                t: cp
                for t, cp in policies(d.proc.pid).items()
                if cp[1] != (BATCH if serving(cp[0]) or t == d.proc.pid else IDLE)
            }

        assert wait_for(lambda: not others(), timeout_s=10), others()
        got = policies(d.proc.pid)
        assert got[d.proc.pid] == ("stallscope", BATCH)  # no client connected
        assert sum(serving(comm) for comm, _ in got.values()) >= 3, got
        assert [p for comm, p in got.values() if comm == "stallscope/hang"] == [BATCH], got
        names = {comm for comm, _ in got.values()}
        for role in ("stallscope/stor", "stallscope/step", "stallscope/sche", "stallscope/api-"):
            assert role in names, names
        # No thread pool of DuckDB's: its default would start one thread per
        # core and 8 I/O threads (named 'stallscope/db' by the daemon).
        assert sum(comm == "stallscope/db" for comm, _ in got.values()) <= 2, got
    finally:
        rc, _ = d.stop()
    assert rc == 0, d.read_log()


def test_main_loop_is_a_batch_thread_while_no_client_is_connected(tmp_path):
    """The probe socket's reader waits at idle priority only while every
    client is known to send slowly: with none connected it is a batch thread
    (a new client's HELLO is read at once, not after a nice-0 spinner on its
    CPU has let it run), once a slow client's rate is known it goes to idle
    priority, and back to batch when that client has gone."""
    d = bcc_daemon(tmp_path)
    try:
        main = lambda: policies(d.proc.pid)[d.proc.pid][1]  # noqa: E731
        assert wait_for(lambda: main() == BATCH, timeout_s=10), main()
        engine = subprocess.Popen(
            [sys.executable, ENGINE, d.socket, "6", "20", "1", "-", "idle"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            # 20 steps/s: its rate is known after a 1 s window, and slow
            assert wait_for(lambda: main() == IDLE, timeout_s=5.5), main()
        finally:
            out, _ = engine.communicate(timeout=60)
        assert json.loads(out.strip().splitlines()[-1])["steps"] > 0
        assert wait_for(lambda: main() == BATCH, timeout_s=10), main()
    finally:
        rc, _ = d.stop()
    assert rc == 0, d.read_log()


def test_the_daemons_periodic_waits_end_in_gaps_the_engine_leaves(tmp_path):
    """With the bcc sched probe the main loop's reads of a slow client and
    the ring readers' waits end at moments a traced thread went to sleep
    and left its CPU idle (the gap clock, stallscope/gaps.py), not on
    timers: an engine at 50 steps/s that sleeps between its steps leaves
    such a moment every 20 ms, so nearly every wait while it runs is woken
    by one; the daemon says how many at exit."""
    import re

    d = bcc_daemon(tmp_path)
    try:
        out = run_engine(d.socket, 6, 1.0, "-", "idle", rate=50)
        assert out["steps"] > 0
    finally:
        rc, _ = d.stop()
    assert rc == 0, d.read_log()
    m = re.search(r"gap clock: (\d+) of (\d+) periodic waits ended in a gap", d.read_log())
    assert m, d.read_log()[-3000:]
    woken, asked = int(m[1]), int(m[2])
    # ~5 main-loop reads and ~10 ring-reader waits a second for ~6 s
    assert woken >= 20, (woken, asked)


def test_stopping_raises_the_threads_sweep_moved_to_idle():
    """A process exits once each of its threads has run again to die; on busy
    CPUs an idle-priority thread waits seconds for that. Stopping raises the
    threads that registered no role (DuckDB's jemalloc thread held a test
    daemon's exit 1.5-7 s after a 0.1 s shutdown under two CPU hogs, past
    the tests' 10 s in CI), not only the registered ones."""
    import threading

    from stallscope import threads

    require_privileged(os.geteuid() == 0, "raising a thread from SCHED_IDLE needs root")
    ev = threading.Event()
    foreign = threading.Thread(target=ev.wait, name="a-library-thread")
    foreign.start()
    try:
        threads.sweep()
        assert os.sched_getscheduler(foreign.native_id) == os.SCHED_IDLE
        assert threads.boost_all() >= 1
        assert os.sched_getscheduler(foreign.native_id) == os.SCHED_OTHER
    finally:
        ev.set()
        foreign.join()


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
def test_a_pinned_engine_is_never_preempted_by_the_daemon(tmp_path):
    """The engine's step thread pinned to one CPU at 200 steps/s (4 spans, ~2.5
    ms of work a step): the daemon keeps every thread on the other CPU, so it
    cannot preempt it; at most one preemption per 10,000 steps is allowed (the
    placement is read again every 5 s: a thread started in between inherits
    its creator's CPUs, so none is expected at all)."""
    d = bcc_daemon(tmp_path)
    try:
        engine = run_engine(d.socket, 30, 2.5, str(CPUS[0]), "idle")
        placed = policies(d.proc.pid)
        cpus_of = {
            tid: os.sched_getaffinity(tid)
            for tid in placed
            if os.path.exists(f"/proc/{d.proc.pid}/task/{tid}")
        }
    finally:
        rc, _ = d.stop()
    assert rc == 0, d.read_log()
    assert all(CPUS[0] not in c for c in cpus_of.values()), cpus_of
    assert "off the traced engines' CPU(s)" in d.read_log()
    by_daemon = preempted_by(d, engine, d.proc.pid)
    assert sum(n for _, n in by_daemon) <= engine["steps"] // 10_000, by_daemon
    assert d.scalar("SELECT count(*) FROM spans") == 4 * engine["steps"] + 0  # every span
    assert d.scalar("SELECT count(*) FROM offcpu WHERE tid = ?", [engine["tid"]]) > 0


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
@pytest.mark.parametrize("boost", ["allowed", "refused"])
def test_under_a_cpu_hog_nothing_is_lost_unreported_and_the_backlog_drains(tmp_path, boost):
    """A normal-priority hog on every CPU starves the daemon's idle-priority
    threads: rows wait (a writer past half its bound is raised to normal
    priority) or, past the bound, are dropped as known losses; once the hog
    ends the backlog drains, and every record the client made is stored or
    reported lost (client drops, gaps, the daemon's own drops by run)."""
    stress = shutil.which("stress-ng")
    require_privileged(stress is not None, "needs stress-ng (the bootstrap installs it)")
    require_privileged(shutil.which("capsh") is not None, "needs capsh (libcap2-bin)")
    api = str(tmp_path / "api.sock")
    cls = DaemonProcess if boost == "allowed" else NoNiceDaemon
    d = bcc_daemon(tmp_path, ["--max-backlog-rows", "20000", "--api-socket", api], cls)
    hog = subprocess.Popen(
        [stress, "--cpu", str(len(CPUS)), "--timeout", "12s", "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        from stallscope.api.client import Client

        engine = run_engine(d.socket, 10, 1.0, "-", "idle", rate=500)
        assert hog.wait(timeout=60) == 0
        client = Client(api)
        # After the hog the writer catches up: nothing stays queued.
        assert wait_for(lambda: client.status().pending_rows == 0, timeout_s=60)
        client.close()
    finally:
        if hog.poll() is None:
            hog.kill()
        rc, _ = d.stop(timeout_s=120)
    assert rc == 0, d.read_log()
    (run,) = reconcile(d, [engine["client"]])
    # Exact in both: a daemon held at idle priority under the hog (raising
    # refused) may read nothing until the engine has exited, its BYE lost to
    # the full socket; the tally page the HELLO passed still says how many
    # records followed the last datagram (docs/wire-protocol.md).
    assert run["made"] == run["stored"] + run["lost"], run
    assert run["stored"] > 0 and run["duplicates"] == 0, run
    dropped = d.query(
        "SELECT probe, count, start_ns <= end_ns FROM losses WHERE reason = 'daemon_backlog'"
    )
    assert all(n > 0 and ordered for _, n, ordered in dropped), dropped
    log = d.read_log()
    if boost == "refused" and "fell behind" in log:
        assert "LimitNICE=+0" in log  # said once, with the fix
