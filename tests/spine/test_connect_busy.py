"""A daemon whose listen backlog is full is retried soon, not in a second.

A connection flood keeps the daemon's backlog full most of the time (it
accepts at most 32 connections a round). A non-blocking connect() then fails
with EAGAIN, which says the daemon is there: a client that waited a second
per try missed a flooded daemon for its whole 1.5 s run (the tail-loss
fault test: drops_disconnected 5001, no run row). Here a plain listening
socket with a backlog of 0 holds one pending connection, so the next one
is refused; no timing is asserted, only when the next try is due and that
it succeeds once the backlog has room.
"""

import socket
import time

import probe_client
from helpers.waiting import wait_for
from probe_client import _connection


def test_a_full_backlog_is_retried_after_busy_retry_not_a_second(tmp_path):
    path = str(tmp_path / "busy.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    server.listen(0)  # one pending connection fills it
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    filler.setblocking(False)
    filler.connect(path)
    try:
        probe = probe_client.connect(socket_path=path, gc=False)
        try:
            assert not probe.connected
            assert probe.stats()["connect_busy"] == 1
            # the next try is due within BUSY_RETRY_NS of the refusal (which
            # is past), not RECONNECT_INTERVAL_NS
            assert probe._next_connect_ns <= time.monotonic_ns() + _connection.BUSY_RETRY_NS
            conn, _ = server.accept()  # the filler's: the backlog has room now
            conn.close()
            assert wait_for(lambda: time.monotonic_ns() >= probe._next_connect_ns, 5)
            t0 = probe.begin()
            time.sleep(0.025)  # an outermost span end sends when the last send is 20 ms old
            probe.end("step", t0)
            assert probe.connected, probe.stats()
            peer, _ = server.accept()
            assert peer.recv(65536)  # the HELLO
            peer.close()
        finally:
            probe.close()
    finally:
        filler.close()
        server.close()


def test_an_absent_daemon_is_retried_once_a_second(tmp_path):
    before = time.monotonic_ns()
    probe = probe_client.connect(socket_path=str(tmp_path / "absent.sock"), gc=False)
    try:
        assert not probe.connected and probe.stats()["connect_busy"] == 0
        assert probe._next_connect_ns - before >= _connection.RECONNECT_INTERVAL_NS
    finally:
        probe.close()
