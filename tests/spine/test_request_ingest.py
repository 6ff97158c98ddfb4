"""Wire version 4: request events from a real client, and bad ones, at a real daemon.

A client's `probe.request` and `probe.request_tokens` calls become
`request_events` rows (one per call, per request of a batch) and one
`requests` row per request, whose counts and end follow events stored in
later flushes; a str id's text arrives once and names its request. What a
client that is not ours could send wrongly is counted in `ingest_errors` by
reason and nothing else is lost: an unknown event code, a negative token
count, events after `finished`, text whose hash is not the id, text parts
that do not make one id. A version-3 client's datagrams (no request
records then) are stored as before, and request records inside them are
unknown types, as a version-3 daemon saw them.
"""

import fcntl
import json
import socket
import struct
import termios
import time

import pytest

import probe_client
from helpers.daemonproc import DaemonProcess
from probe_client import wire
from stallscope.service.server import DECODE_INTERVAL_S

pytestmark = pytest.mark.daemon


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProcess(tmp_path).start()
    yield d
    if d.proc.poll() is None:
        d.stop()


def _hdr(version, kind, count=0, first_seq=0):
    return wire.HEADER.pack(
        wire.MAGIC, version, kind, count, 32, first_seq, time.monotonic_ns(), 0, 0
    )


def _req(code, rid, ts, tokens=None, flags=0, tid=7):
    has = wire.REQ_HAS_TOKENS if tokens is not None else 0
    return wire.REQUEST_RECORD.pack(
        wire.REC_REQUEST, code, flags | has, tid, ts, rid, tokens or 0, 0
    )


def _text(rid, raw, length=None):
    length = len(raw) if length is None else length
    parts = [raw[i : i + 20] for i in range(0, min(len(raw), 64), 20)]
    return b"".join(
        wire.REQUEST_TEXT_RECORD.pack(wire.REC_REQUEST_TEXT, i, length, rid, p)
        for i, p in enumerate(parts)
    )


def _unread(sock):
    """Bytes the peer has not read yet from this socket (SIOCOUTQ)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]


def _raw_client(daemon, version, token, datagrams, pause_s=0):
    """A client of our own making: HELLO, then each list of records as one
    RECORDS datagram with consecutive sequence numbers, then BYE. With
    pause_s, each datagram is sent once the daemon has read the one before
    (the socket's send queue is empty) and pause_s after (more than the
    daemon's DECODE_INTERVAL_S: each its own decode)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(daemon.socket)
    s.send(_hdr(version, wire.DGRAM_HELLO) + json.dumps({"run_token": token}).encode())
    seq = 0
    for records in datagrams:
        s.send(_hdr(version, wire.DGRAM_RECORDS, len(records), seq) + b"".join(records))
        seq += sum(1 for r in records if r[0] != wire.REC_STRING)
        if pause_s:
            deadline = time.monotonic() + 30
            while _unread(s) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(pause_s)
    s.send(_hdr(version, wire.DGRAM_BYE, 0, seq))
    s.recv(10)
    s.close()


E = wire.REQUEST_EVENT_CODES


def test_a_real_clients_requests_are_stored_with_their_counts(daemon):
    probe = probe_client.connect(socket_path=daemon.socket, gc=False)
    probe.request("req-α-1", "arrived", tokens=12)  # a prompt of 12 tokens
    probe.request(2, "arrived")
    probe.request("req-α-1", "scheduled")
    probe.request(2, "scheduled")
    for _ in range(5):
        probe.request_tokens(["req-α-1", 2], [1, 2])
        probe.flush()  # each step in its own datagram: rows change after they are stored
        time.sleep(0.25)
    probe.request(2, "token", tokens=3)
    probe.request("req-α-1", "finished")
    probe.request(2, "aborted")
    stats = probe.stats()
    probe.close()
    assert daemon.stop()[0] == 0, daemon.read_log()
    assert stats["errors"] == 0 and stats["request_errors"] == 0
    assert daemon.query("SELECT reason, sum(count) FROM ingest_errors GROUP BY ALL") == []
    key = probe_client.request_key("req-α-1")
    assert key == wire.request_key("req-α-1".encode())
    rows = daemon.query(
        "SELECT request_id, text, end_event, events, output_tokens, first_ns < last_ns "
        "FROM requests ORDER BY request_id"
    )
    assert sorted(rows) == sorted(
        [(2, None, "aborted", 9, 13, True), (key, "req-α-1", "finished", 8, 5, True)]
    )
    events = daemon.query("SELECT request_id, event, tokens FROM request_events ORDER BY seq")
    assert len(events) == 17
    assert events[0] == (key, "arrived", 12) and events[1] == (2, "arrived", None)
    assert events[4:6] == [(key, "token", 1), (2, "token", 2)]
    assert events[-3:] == [(2, "token", 3), (key, "finished", None), (2, "aborted", None)]
    # one thread, the client's own, and times in order
    assert daemon.scalar("SELECT count(DISTINCT tid) FROM request_events") == 1
    # every record the client numbered is stored: 17 events and the text
    # of the str id (9 bytes of UTF-8: one part)
    assert stats["next_seq"] == 18
    assert daemon.query("SELECT records FROM runs") == [(18,)]


def test_bad_request_records_are_counted_by_reason_and_nothing_else_is_lost(daemon):
    raw = b"req-bad"
    good = wire.request_key(raw)
    t = time.monotonic_ns()
    _raw_client(
        daemon,
        4,
        1,
        [
            [
                _req(E["arrived"], good, t, flags=wire.REQ_STR_ID),
                _text(good, raw),
                _req(E["arrived"], 5, t),
                _text(5, b"not-the-hash-of-5"),  # text whose hash is not the id
                _req(0, 5, t + 1),  # code 0: never an event
                _req(99, 5, t + 2),  # unknown event
                _req(E["token"], 5, t + 3, tokens=-4),  # negative tokens
                _req(E["token"], 5, t + 4, tokens=4),
                _req(E["finished"], 5, t + 5),
                _req(E["token"], 5, t + 6, tokens=1),  # after finished, same datagram
            ],
            [
                _req(E["token"], 5, t + 7, tokens=1),  # after finished, a later datagram
                _req(E["finished"], 5, t + 8),  # a second finish
                _req(E["arrived"], 6, t + 9),
                wire.REQUEST_TEXT_RECORD.pack(wire.REC_REQUEST_TEXT, 3, 70, 6, b"x"),  # bad part
                _req(E["token"], good, t + 10, tokens=2),
                _req(E["finished"], good, t + 11),
            ],
        ],
    )
    assert daemon.stop()[0] == 0, daemon.read_log()
    errors = dict(daemon.query("SELECT reason, sum(count) FROM ingest_errors GROUP BY ALL"))
    assert errors == {
        "request_unknown_event": 2,
        "request_negative_tokens": 1,
        "request_after_finished": 3,
        "request_id_hash_mismatch": 1,
        "bad_request_text": 1,
    }, errors
    assert daemon.query(
        "SELECT request_id, text, end_event, events, output_tokens FROM requests ORDER BY 1"
    ) == sorted(
        [(5, None, "finished", 3, 4), (6, None, None, 1, 0), (good, "req-bad", "finished", 3, 2)]
    )
    # no gap: every record was numbered and read
    assert daemon.query("SELECT count(*) FROM losses WHERE run_id IS NOT NULL") == [(0,)]


def test_a_version_3_client_is_stored_as_before(daemon):
    t = time.monotonic_ns()
    _raw_client(
        daemon,
        3,
        2,
        [
            [wire.STRING_RECORD.pack(wire.REC_STRING, 0, 1, 0, b"step")],
            [
                wire.RECORD.pack(wire.REC_SPAN, 0, 1, 7, t, t + 10, 0, 4),
                _req(E["arrived"], 5, t),  # not a record type in version 3
            ],
        ],
    )
    assert daemon.stop()[0] == 0, daemon.read_log()
    assert daemon.query("SELECT reason, sum(count) FROM ingest_errors GROUP BY ALL") == [
        ("unknown_record_type", 1)
    ]
    assert daemon.query("SELECT batch FROM spans") == [(4,)]
    assert daemon.scalar("SELECT count(*) FROM request_events") == 0


def test_open_requests_silent_past_the_timeout_are_evicted_and_counted(tmp_path):
    d = DaemonProcess(tmp_path, extra_args=["--requests-open-timeout-s", "1"]).start()
    s = 1_000_000_000
    t = time.monotonic_ns()
    _raw_client(
        d,
        4,
        2,
        [
            [_req(E["arrived"], 10, t), _req(E["token"], 10, t + 1, tokens=1),
             _req(E["arrived"], 11, t + 2)],
            # 2 s later on the client's clock: 10 and 11 have been silent > 1 s
            [_req(E["arrived"], 12, t + 2 * s), _req(E["token"], 12, t + 2 * s + 1, tokens=1)],
            [_req(E["token"], 10, t + 2 * s + 2, tokens=1),  # after its eviction
             _req(E["finished"], 12, t + 2 * s + 3)],
        ],
        pause_s=DECODE_INTERVAL_S + 0.1,
    )  # fmt: skip
    assert d.stop()[0] == 0, d.read_log()
    errors = dict(d.query("SELECT reason, sum(count) FROM ingest_errors GROUP BY ALL"))
    assert errors == {"request_open_timeout": 2, "request_after_eviction": 1}, errors
    assert d.query(
        "SELECT request_id, end_event, events, output_tokens FROM requests ORDER BY 1"
    ) == [(10, "evicted", 2, 1), (11, "evicted", 1, 0), (12, "finished", 3, 1)]
    assert d.scalar("SELECT count(*) FROM request_events") == 6


class _Peer:
    """A raw client connected with a group key (HELLO `group`), kept open:
    `send(records)` sends one RECORDS datagram and returns once the daemon
    has read it and had time to decode it."""

    def __init__(self, daemon, token, group):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.connect(daemon.socket)
        hello = {"run_token": token, "group": group}
        self.sock.send(_hdr(4, wire.DGRAM_HELLO) + json.dumps(hello).encode())
        self.seq = 0

    def send(self, *records):
        self.sock.send(_hdr(4, wire.DGRAM_RECORDS, len(records), self.seq) + b"".join(records))
        self.seq += len(records)
        deadline = time.monotonic() + 30
        while _unread(self.sock) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(DECODE_INTERVAL_S + 0.1)  # each send decoded on its own

    def bye(self):
        self.sock.send(_hdr(4, wire.DGRAM_BYE, 0, self.seq))
        self.sock.recv(10)
        self.sock.close()


def test_a_request_handed_from_a_caller_to_its_engine_is_one_request(daemon):
    # vLLM's shape: the caller (or API server) sees each request arrive, the
    # engine core (another process of its run group) serves it. Each order
    # in which the daemon can read the two: the caller's arrival first, the
    # core's whole request first, the core's arrival first.
    ms = 1_000_000
    t = time.monotonic_ns()
    caller = _Peer(daemon, 11, "engine-a")
    core = _Peer(daemon, 12, "engine-a")
    other = _Peer(daemon, 13, "engine-b")  # another group: its ids are its own
    caller.send(_req(E["arrived"], 1, t))
    core.send(_req(E["arrived"], 1, t + 2 * ms), _req(E["token"], 1, t + 9 * ms, tokens=1))
    core.send(_req(E["arrived"], 2, t + 3 * ms), _req(E["token"], 2, t + 8 * ms, tokens=2),
              _req(E["finished"], 2, t + 10 * ms))  # fmt: skip
    caller.send(_req(E["arrived"], 2, t + 1 * ms))  # read after its request ended
    core.send(_req(E["arrived"], 4, t + 6 * ms))
    caller.send(_req(E["arrived"], 4, t + 5 * ms))  # earlier, read later
    caller.send(_req(E["arrived"], 3, t + 4 * ms))  # no process serves it (yet)
    other.send(_req(E["arrived"], 1, t + 7 * ms), _req(E["finished"], 1, t + 8 * ms))
    core.send(_req(E["token"], 4, t + 11 * ms, tokens=1), _req(E["finished"], 1, t + 12 * ms),
              _req(E["finished"], 4, t + 13 * ms))  # fmt: skip
    caller.send(_req(E["aborted"], 1, t + 14 * ms))  # an event after the hand-off
    # the caller's arrival read first, then the core's whole request in one
    # decode (a request aborted within one decode interval), by another process of the group
    caller.send(_req(E["arrived"], 5, t + 15 * ms))
    late = _Peer(daemon, 14, "engine-a")
    late.send(_req(E["arrived"], 5, t + 16 * ms), _req(E["token"], 5, t + 17 * ms, tokens=1),
              _req(E["aborted"], 5, t + 18 * ms))  # fmt: skip
    late.bye()
    for peer in (caller, core, other):
        peer.bye()
    assert daemon.stop()[0] == 0, daemon.read_log()
    errors = dict(daemon.query("SELECT reason, sum(count) FROM ingest_errors GROUP BY ALL"))
    assert errors == {"request_after_handoff": 1}, errors
    runs = dict(daemon.query("SELECT client_token, run_id FROM runs"))
    a, b, c, d = runs[11], runs[12], runs[13], runs[14]
    ends = daemon.query("SELECT run_id, request_id, end_event FROM requests ORDER BY 1, 2")
    assert ends == [(a, 1, "handed"), (a, 2, "handed"), (a, 3, None), (a, 4, "handed"),
                    (a, 5, "handed"), (b, 1, "finished"), (b, 2, "finished"),
                    (b, 4, "finished"), (c, 1, "finished"), (d, 5, "aborted")]  # fmt: skip
    rows = daemon.query(
        "SELECT run_id, request_id, arrival_run_id, arrival_ns - ?, own_arrival_ns - ?, "
        "ttft_ns, e2e_ns FROM request_latency ORDER BY 1, 2",
        [t, t],
    )
    assert rows == [
        (a, 3, a, 4 * ms, 4 * ms, None, None),  # the caller's own open request
        (b, 1, a, 0, 2 * ms, 9 * ms, 12 * ms),
        (b, 2, a, 1 * ms, 3 * ms, 7 * ms, 9 * ms),
        (b, 4, a, 5 * ms, 6 * ms, 6 * ms, 8 * ms),
        (c, 1, c, 7 * ms, 7 * ms, None, 1 * ms),
        (d, 5, a, 15 * ms, 16 * ms, 2 * ms, 3 * ms),
    ], rows
