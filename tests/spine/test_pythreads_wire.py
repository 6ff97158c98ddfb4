"""Wire version 3: the CPU sampler's PYLAYOUT and PYTHREADS datagrams at ingest.

A real daemon (no CPU sampler: what is checked here is ingest's, and it runs
unprivileged) takes a real client's report without a complaint, and counts
every inconsistent one by reason: a layout that is not JSON, one whose
version or build disagree with the HELLO, threads before a layout, a bad
thread record, a thread that is not the peer's own (`/proc/PID/task` of the
SO_PEERCRED pid). In a version-2 datagram the new kinds are `bad_kind`, as
a version-2 daemon would see them. A client on an interpreter it cannot
introspect (CPython 3.9) says so once and sends no thread list.
"""

import json
import os
import socket
import subprocess
import threading
import time

import pytest

import probe_client
from helpers import pythons
from helpers.daemonproc import DaemonProcess
from probe_client import wire

pytestmark = pytest.mark.daemon

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProcess(tmp_path).start()
    yield d
    if d.proc.poll() is None:
        d.stop()


def _hdr(version, kind, count=0):
    return wire.HEADER.pack(wire.MAGIC, version, kind, count, 32, 0, time.monotonic_ns(), 0, 0)


def _threads(records):
    return b"".join(
        wire.PYTHREAD_RECORD.pack(rtype, 0, 0, tid, addr, 0, 0) for rtype, tid, addr in records
    )


def _client(daemon, hello, *datagrams):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(daemon.socket)
    s.send(_hdr(3, wire.DGRAM_HELLO) + json.dumps(hello).encode())
    for d in datagrams:
        s.send(d)
    s.send(_hdr(3, wire.DGRAM_BYE))
    s.recv(10)
    s.close()


def test_inconsistent_reports_are_counted_by_reason(daemon):
    from probe_client import _pythreads

    layout = _pythreads.Reporter().layout  # this interpreter's real report
    me = os.getpid()
    ev = threading.Event()
    mine = threading.Thread(target=ev.wait)  # a thread of this, the peer's, process
    mine.start()
    hello = {"run_token": 1, "python": ".".join(map(str, json.loads(layout)["version"]))}
    try:
        # a good report: layout, then threads that are this process's own
        _client(
            daemon,
            hello,
            _hdr(3, wire.DGRAM_PYLAYOUT) + layout,
            _hdr(3, wire.DGRAM_PYTHREADS, 2)
            + _threads([(wire.REC_PYTHREAD, mine.native_id, 0x7F0000001000),
                        (wire.REC_PYTHREAD, threading.get_native_id(), 0x7F0000002000)]),
        )  # fmt: skip
        _client(daemon, {**hello, "run_token": 2}, _hdr(3, wire.DGRAM_PYLAYOUT) + b"{not json")
        _client(
            daemon,
            {**hello, "run_token": 3},
            _hdr(3, wire.DGRAM_PYTHREADS, 1) + _threads([(wire.REC_PYTHREAD, me, 0x7F0000001000)]),
        )  # threads before any layout
        _client(
            daemon,
            {**hello, "run_token": 4, "python": "3.12.1"},
            _hdr(3, wire.DGRAM_PYLAYOUT) + layout,
        )  # the HELLO says another version
        _client(
            daemon,
            {**hello, "run_token": 5},
            _hdr(3, wire.DGRAM_PYLAYOUT) + layout,
            _hdr(3, wire.DGRAM_PYTHREADS, 3)
            + _threads([(wire.REC_PYTHREAD, 1, 0x7F0000001000),  # pid 1's, not ours
                        (wire.REC_SPAN, me, 0x7F0000001000),  # not a PYTHREAD record
                        (wire.REC_PYTHREAD, me, 12)]),  # no user-space address
        )  # fmt: skip
        # version 2: the new kinds do not exist there
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(daemon.socket)
        s.send(_hdr(2, wire.DGRAM_HELLO) + json.dumps({"run_token": 6}).encode())
        s.send(_hdr(2, wire.DGRAM_PYLAYOUT) + layout)
        s.send(_hdr(2, wire.DGRAM_BYE))
        s.recv(10)
        s.close()
    finally:
        ev.set()
        mine.join()
    rc, _ = daemon.stop()
    assert rc == 0, daemon.read_log()[-4000:]
    errors = dict(daemon.query("SELECT reason, sum(count) FROM ingest_errors GROUP BY ALL"))
    assert errors == {
        "bad_pylayout": 1,
        "bad_pythreads": 3,  # before a layout, a wrong record type, a bad address
        "pylayout_mismatch": 1,
        "foreign_tid": 1,
        "bad_kind": 1,
    }, errors
    assert daemon.scalar("SELECT count(*) FROM runs") == 6


def test_a_real_client_reports_without_complaint_and_old_clients_still_work(daemon):
    os.environ["STALLSCOPE_PYTHREADS_INTERVAL_MS"] = "50"
    try:
        probe = probe_client.connect(socket_path=daemon.socket, gc=False)

        def wait_sent(n):
            deadline = time.monotonic() + 10
            while probe.stats()["pythreads_sent"] < n and time.monotonic() < deadline:
                time.sleep(0.02)

        wait_sent(1)  # the first list
        time.sleep(0.2)
        assert probe.stats()["pythreads_sent"] == 1  # unchanged: not sent again
        ev = threading.Event()
        t = threading.Thread(target=ev.wait)
        t.start()
        wait_sent(2)  # the list with the new thread
        for _ in range(10):
            probe.end("step", probe.begin())
        stats = probe.stats()
        probe.close()
        ev.set()
        t.join()
    finally:
        del os.environ["STALLSCOPE_PYTHREADS_INTERVAL_MS"]
    # a version-1 client next to it
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(daemon.socket)
    s.send(_hdr(1, wire.DGRAM_HELLO) + json.dumps({"run_token": 9, "label": "v1"}).encode())
    s.send(
        _hdr(1, wire.DGRAM_RECORDS, 1) + wire.STRING_RECORD.pack(wire.REC_STRING, 0, 1, 0, b"step")
    )
    s.send(_hdr(1, wire.DGRAM_RECORDS, 1) + wire.RECORD.pack(wire.REC_SPAN, 0, 1, 7, 10, 20, 0, 4))
    s.send(wire.HEADER.pack(wire.MAGIC, 1, wire.DGRAM_BYE, 0, 32, 1, 1, 0, 0))
    s.recv(10)
    s.close()
    assert daemon.stop()[0] == 0, daemon.read_log()
    assert stats["pythreads_status"] == "ok" and stats["pythreads_errors"] == 0
    assert stats["pythreads_sent"] >= 2
    assert daemon.query("SELECT reason, sum(count) FROM ingest_errors GROUP BY ALL") == []
    assert daemon.query(
        "SELECT r.label, count(*) FROM spans JOIN runs r USING (run_id) GROUP BY ALL ORDER BY 1"
    ) == [("", 10), ("v1", 1)]


def test_a_client_that_cannot_introspect_says_so_once_and_sends_nothing(daemon):
    py39 = pythons.require(pythons.pyenv_python("3.9.18"), "CPython 3.9.18")
    code = (
        "import json, sys, time, probe_client\n"
        f"p = probe_client.connect(socket_path={daemon.socket!r}, gc=False)\n"
        "time.sleep(2.5)\n"
        "for _ in range(5): p.end('step', p.begin())\n"
        "st = p.stats(); p.close(); print(json.dumps(st))\n"
    )
    env = {**os.environ, "PYTHONPATH": ROOT, "STALLSCOPE_PYTHREADS_INTERVAL_MS": "100"}
    out = subprocess.run([py39, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)
    assert daemon.stop()[0] == 0, daemon.read_log()
    assert stats["pythreads_status"].startswith("refused: CPython 3.9: unknown frame layout")
    assert stats["pythreads_sent"] == 0 and stats["pythreads_errors"] == 0
    assert out.stderr == ""  # nothing on the engine's stderr
    assert daemon.query("SELECT reason, sum(count) FROM ingest_errors GROUP BY ALL") == []
    assert daemon.scalar("SELECT count(*) FROM spans") == 5  # the rest works as before
