"""Probe ingest: the SOCK_SEQPACKET listener, per-run state, batch decoding.

Accepts probe connections, records the kernel's view of the peer
(SO_PEERCRED: pid, uid, gid; never a pid the client claims), checks every
datagram's header and sequence numbers, and queues raw record bytes per run.
Every `decode_pending()` (the daemon calls it at least every 200 ms) turns
each run's queued bytes into columns with numpy, without a Python object per
record, and appends them to the store. Gaps in a run's sequence numbers are
stored as losses; malformed input is rejected, counted by reason, and never
disturbs other connections. Never blocks: sockets are non-blocking and the
loop is driven by a selector.
"""

import errno
import json
import logging
import os
import selectors
import socket
import struct
import threading
import time
from collections import Counter

import numpy as np

from probe_client import wire
from stallscope.service.sockets import prepare_path

log = logging.getLogger("stallscope.ingest")

RECORD_DTYPE = np.dtype(
    [
        ("rtype", "u1"),
        ("flags", "u1"),
        ("kind_id", "<u2"),
        ("tid", "<u4"),
        ("start_ns", "<u8"),
        ("end_ns", "<u8"),
        ("a", "<u4"),
        ("b", "<u4"),
    ]
)
assert RECORD_DTYPE.itemsize == wire.RECORD_SIZE

_PEERCRED = struct.Struct("3i")
_INT64_MAX = (1 << 63) - 1
# Sequence numbers at or above this are rejected (`seq_out_of_range`): they
# are stored as BIGINT, and no client makes 2^62 records.
SEQ_LIMIT = 1 << 62
# How long shutdown keeps reading what clients already sent.
SHUTDOWN_DRAIN_S = 1.0
_RECV_MAX = wire.HEADER_SIZE + wire.HELLO_MAX
_TYPE_SPAN = bytes([wire.REC_SPAN])
_TYPE_GC = bytes([wire.REC_GC])
_TYPE_STRING = bytes([wire.REC_STRING])


class RunState:
    """What the daemon knows about one probe run while it is connected."""

    __slots__ = (
        "run_id",
        "token",
        "pid",
        "expected_seq",
        "names",
        "chunks",
        "first_seqs",
        "counts",
        "drops_full",
        "drops_disconnected",
        "records",
        "last_sent_ns",
        "connected",
        "unflushed",
    )

    def __init__(self, run_id, token, pid, expected_seq):
        self.run_id = run_id
        self.token = token
        self.pid = pid
        self.expected_seq = expected_seq
        self.names = [None]  # string id -> name; id 0 = none
        self.chunks = []  # raw record bytes waiting to be decoded
        self.first_seqs = []  # first sequence number of each chunk
        self.counts = []  # records in each chunk
        self.drops_full = 0
        self.drops_disconnected = 0
        self.records = 0
        self.last_sent_ns = 0
        self.connected = True
        self.unflushed = False


class Connection:
    __slots__ = ("sock", "pid", "uid", "gid", "run", "closing")

    def __init__(self, sock, pid, uid, gid):
        self.sock = sock
        self.pid = pid
        self.uid = uid
        self.gid = gid
        self.run = None
        self.closing = False


class Ingest:
    """The probe socket and everything that comes through it."""

    def __init__(
        self,
        store,
        socket_path=None,
        listen_fd=None,
        host=None,
        allowed_uids=None,
        on_track=None,
        on_untrack=None,
        on_run_end=None,
        socket_group=None,
    ):
        self.store = store
        self.socket_path = socket_path
        self.host = host or socket.gethostname()
        self.allowed_uids = set(allowed_uids) if allowed_uids else None
        # on_track(pid, run_id) for every run (re)connected, on_run_end(run_id)
        # for every run whose connection closed, on_untrack(pid) once no
        # connection of the process is left.
        self.on_track = on_track or (lambda pid, run_id=None: None)
        self.on_untrack = on_untrack or (lambda pid: None)
        self.on_run_end = on_run_end or (lambda run_id: None)
        self.selector = selectors.DefaultSelector()
        self.conns = {}  # fd -> Connection
        self.runs = {}  # run_id -> RunState (what decode_pending walks)
        self.runs_by_token = {}  # (client token, kernel pid) -> RunState, for resuming
        self.rejections = Counter()
        self._pending_rejections = Counter()  # (run_id, pid, reason) -> n
        self._losses = []  # (run_id, start_ns, end_ns, count, reason) to append
        self.datagrams = 0
        self.records_received = 0
        self.lost_records = 0
        self._lock = threading.Lock()  # guards run state between loop and decode
        self._next_run_id = self._max_run_id() + 1
        self.listener = self._open_listener(socket_path, listen_fd, socket_group)
        if listen_fd is not None:
            # The socket file belongs to whoever passed the descriptor (systemd):
            # removing it at exit would break the next socket activation.
            self.socket_path = None
        self.selector.register(self.listener, selectors.EVENT_READ, None)

    # ----- set-up ------------------------------------------------------------
    def _max_run_id(self):
        cur = self.store.cursor()
        try:
            return cur.execute("SELECT coalesce(max(run_id), 0) FROM runs").fetchone()[0]
        finally:
            cur.close()

    def _open_listener(self, path, listen_fd, group):
        if listen_fd is not None:
            sock = socket.socket(fileno=listen_fd)
            if sock.type != socket.SOCK_SEQPACKET:
                raise SystemExit(
                    f"error: inherited probe socket (fd {listen_fd}) is not "
                    "SOCK_SEQPACKET; use ListenSequentialPacket= in the unit"
                )
            sock.setblocking(False)
            return sock
        if not path:
            raise SystemExit("error: no probe socket path given (--socket)")
        if not prepare_path(path, socket.SOCK_SEQPACKET):
            raise SystemExit(f"error: another daemon is listening on {path}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        old = os.umask(0o117)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o660)
        if group is not None:
            try:
                os.chown(path, -1, group)
            except OSError as exc:
                log.warning("could not give %s to group %s: %s", path, group, exc)
        sock.listen(128)
        sock.setblocking(False)
        return sock

    # ----- event loop ----------------------------------------------------------
    def poll(self, timeout):
        """Serve sockets for up to `timeout` seconds (one selector round)."""
        for key, _ in self.selector.select(timeout):
            if key.data is None:
                self._accept()
            else:
                self._read(key.data)

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("accept failed: %s", exc)
                return
            sock.setblocking(False)
            pid, uid, gid = _PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            )
            if self.allowed_uids is not None and uid not in self.allowed_uids:
                log.warning("refused probe connection from pid %d: uid %d not allowed", pid, uid)
                self._reject(None, pid, "uid_not_allowed")
                sock.close()
                continue
            conn = Connection(sock, pid, uid, gid)
            self.conns[sock.fileno()] = conn
            self.selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn):
        sock = conn.sock
        for _ in range(256):  # bounded, so one busy client cannot starve others
            try:
                data = sock.recv(_RECV_MAX)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._close(conn)
                return
            try:
                self._datagram(conn, data)
            except Exception:
                if self.rejections["internal_error"] < 10:
                    log.exception("bug: datagram from pid %d could not be handled", conn.pid)
                self._reject(conn.run.run_id if conn.run else None, conn.pid, "internal_error")
            if conn.closing:
                self._close(conn)
                return
        return True  # the bound was hit: more may be waiting

    def drain(self):
        """Read everything already queued on every connection (shutdown)."""
        self._accept()
        for conn in list(self.conns.values()):
            self._read(conn)

    # ----- datagrams -------------------------------------------------------------
    def _datagram(self, conn, data):
        self.datagrams += 1
        run = conn.run
        run_id = run.run_id if run else None
        if len(data) < wire.HEADER_SIZE:
            return self._reject(run_id, conn.pid, "short_datagram")
        (magic, version, kind, count, rsize, first_seq, sent_ns, drops_full, drops_disc) = (
            wire.HEADER.unpack_from(data)
        )
        sent_ns = min(sent_ns, _INT64_MAX)  # stored as BIGINT; a lie must not fail a flush
        if magic != wire.MAGIC:
            return self._reject(run_id, conn.pid, "bad_magic")
        if version != wire.VERSION:
            return self._reject(run_id, conn.pid, "bad_version")
        if kind == wire.DGRAM_HELLO:
            if run is not None:
                return self._reject(run_id, conn.pid, "duplicate_hello")
            if first_seq >= SEQ_LIMIT:
                return self._reject(None, conn.pid, "seq_out_of_range")
            return self._hello(conn, data, first_seq, sent_ns)
        if kind == wire.DGRAM_BYE:
            if run is None:
                return self._reject(None, conn.pid, "no_hello")
            conn.closing = True
            if first_seq < SEQ_LIMIT:
                with self._lock:
                    # Records the client numbered but could not send after its
                    # last datagram (a full socket at close) are a loss too.
                    if first_seq > run.expected_seq:
                        self._gap(
                            run, first_seq - run.expected_seq, sent_ns, drops_full, drops_disc
                        )
                        run.expected_seq = first_seq
            return None
        if kind != wire.DGRAM_RECORDS:
            return self._reject(run_id, conn.pid, "bad_kind")
        if run is None:
            return self._reject(None, conn.pid, "no_hello")
        if rsize != wire.RECORD_SIZE:
            return self._reject(run_id, conn.pid, "bad_record_size")
        if len(data) != wire.HEADER_SIZE + count * wire.RECORD_SIZE:
            return self._reject(run_id, conn.pid, "length_mismatch")
        if count == 0:
            return None
        types = data[wire.HEADER_SIZE :: wire.RECORD_SIZE]
        n_strings = types.count(_TYPE_STRING)
        n_seq = count - n_strings
        if first_seq >= SEQ_LIMIT:
            return self._reject(run_id, conn.pid, "seq_out_of_range")
        with self._lock:
            if first_seq < run.expected_seq:
                return self._reject(run_id, conn.pid, "seq_regress")
            if first_seq > run.expected_seq:
                self._gap(run, first_seq - run.expected_seq, sent_ns, drops_full, drops_disc)
                # Counted once: a datagram of only STRING records (sent after
                # a drop, before the records that use the new name) carries
                # the gap too, and the next datagram must not count it again.
                run.expected_seq = first_seq
            run.drops_full, run.drops_disconnected = drops_full, drops_disc
            run.last_sent_ns = sent_ns
            if n_strings:
                self._strings(run, data, count)
            if n_seq:
                n_unknown = n_seq - types.count(_TYPE_SPAN) - types.count(_TYPE_GC)
                if n_unknown:
                    self._reject(run_id, conn.pid, "unknown_record_type", n_unknown)
                run.chunks.append(data[wire.HEADER_SIZE :])
                run.first_seqs.append(first_seq)
                run.counts.append(count)
                run.expected_seq = first_seq + n_seq
                self.records_received += n_seq
        return None

    def _strings(self, run, data, count):
        for i in range(count):
            off = wire.HEADER_SIZE + i * wire.RECORD_SIZE
            if data[off] != wire.REC_STRING:
                continue
            _, _, sid, _, raw = wire.STRING_RECORD.unpack_from(data, off)
            if sid == 0:
                continue
            name = raw.rstrip(b"\0").decode("utf-8", "replace")
            names = run.names
            if sid >= len(names):
                if sid > 0xFFFF:
                    continue
                names.extend([None] * (sid + 1 - len(names)))
            names[sid] = name

    def _gap(self, run, missing, sent_ns, drops_full, drops_disc):
        if drops_disc > run.drops_disconnected:
            reason = "client_disconnected"
        elif drops_full > run.drops_full:
            reason = "client_socket_full"
        else:
            reason = "sequence_gap"
        self._loss(run, missing, run.last_sent_ns or sent_ns, sent_ns, reason)

    def _loss(self, run, count, start_ns, end_ns, reason):
        # Queued as rows and appended as one batch per decode: one INSERT
        # statement per gap costs ~2.5 ms of the writer's time here, and an
        # overloaded client makes a gap per datagram.
        self.lost_records += count
        self._losses.append((run.run_id, start_ns, end_ns, count, reason))

    def _hello(self, conn, data, first_seq, sent_ns):
        try:
            info = json.loads(data[wire.HEADER_SIZE :].decode("utf-8"))
            if not isinstance(info, dict):
                raise ValueError("not an object")
            token = int(info.get("run_token", 0)) & 0xFFFFFFFFFFFFFFFF
        except (ValueError, TypeError, OverflowError, RecursionError):
            # UnicodeDecodeError is a ValueError; Infinity is an OverflowError;
            # "[[[[..." nested 5000 deep is a RecursionError.
            return self._reject(None, conn.pid, "bad_hello")
        now = time.monotonic_ns()
        with self._lock:
            # A token is only honoured for the same kernel pid, and token 0
            # (none given) never resumes anything: two runs never share state.
            run = self.runs_by_token.get((token, conn.pid)) if token else None
            if run is None:
                run = self._known_run(token, conn.pid)
            if run is None:
                run = RunState(self._next_run_id, token, conn.pid, first_seq)
                self._next_run_id += 1
                self._insert_run(run, conn, info, now)
                if first_seq > 0:  # records the client made before it could connect
                    self._loss(
                        run,
                        first_seq,
                        _int(info.get("monotonic_ns")) or sent_ns,
                        sent_ns,
                        "client_disconnected",
                    )
            else:
                if first_seq > run.expected_seq:
                    # connected is None: the run comes from the database, so
                    # the gap is what the previous daemon had not committed
                    # plus what the client dropped while no daemon was there.
                    reason = (
                        "client_disconnected"
                        if run.connected is False
                        else "daemon_restart"
                        if run.connected is None
                        else "sequence_gap"
                    )
                    self._loss(run, first_seq - run.expected_seq, run.last_sent_ns, sent_ns, reason)
                    run.expected_seq = first_seq
                run.names = [None]  # the client re-sends every name on a new connection
                self.store.sql(
                    "UPDATE runs SET connections = connections + 1, ended_ns = NULL "
                    "WHERE run_id = ?",
                    [run.run_id],
                )
            run.connected = True
            run.last_sent_ns = sent_ns
            conn.run = run
            self.runs[run.run_id] = run
            if token:
                self.runs_by_token[(token, conn.pid)] = run
        log.info(
            "run %d: pid %d uid %d connected (%s)",
            run.run_id,
            conn.pid,
            conn.uid,
            info.get("label") or "no label",
        )
        self.on_track(conn.pid, run.run_id)
        return None

    def _known_run(self, token, pid):
        """A run this database already holds (the daemon was restarted)."""
        if not token:
            return None
        try:
            cur = self.store.cursor()
            try:
                row = cur.execute(
                    "SELECT run_id, last_seq FROM runs WHERE client_token = ? "
                    "AND pid = ? ORDER BY run_id DESC LIMIT 1",
                    [token, pid],
                ).fetchone()
            finally:
                cur.close()
        except Exception as exc:  # the store may be reopening after a disk error
            log.warning("could not look up run token for pid %d: %s", pid, exc)
            return None
        if row is None:
            return None
        run = RunState(row[0], token, pid, (row[1] if row[1] is not None else -1) + 1)
        run.connected = None  # unknown: the gap's reason is the restart
        return run

    def _insert_run(self, run, conn, info, now):
        def ints(v):
            return [_int(x, 32) for x in v[:16]] if isinstance(v, list) else None

        argv = info.get("argv")
        self.store.sql(
            "INSERT INTO runs (run_id, pid, uid, gid, claimed_pid, tid, label, host, "
            "started_ns, realtime_ns, python, implementation, free_threaded, gc_threshold, "
            "gc_count, freeze_count, gc_enabled, argv, client_token, connected_ns, last_seq, "
            "records, connections) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
            "?, ?, ?, ?, 0, 1)",
            [
                run.run_id,
                conn.pid,
                conn.uid,
                conn.gid,
                _int(info.get("pid"), 32),
                _int(info.get("tid")),
                str(info.get("label") or "")[:200],
                self.host,
                _int(info.get("monotonic_ns")),
                _int(info.get("realtime_ns")),
                str(info.get("python") or "")[:40],
                str(info.get("implementation") or "")[:40],
                bool(info.get("free_threaded")),
                ints(info.get("gc_threshold")),
                ints(info.get("gc_count")),
                _int(info.get("freeze_count")),
                info.get("gc_enabled") if isinstance(info.get("gc_enabled"), bool) else None,
                [str(a)[:500] for a in argv[:64]] if isinstance(argv, list) else None,
                run.token,
                now,
                run.expected_seq - 1,
            ],
        )

    def _reject(self, run_id, pid, reason, n=1):
        self.rejections[reason] += n
        self._pending_rejections[(run_id, pid, reason)] += n
        if self.rejections[reason] == n or self.rejections[reason] % 10000 == 0:
            log.warning("rejected %s from pid %s (%d so far)", reason, pid, self.rejections[reason])
        return None

    def _close(self, conn):
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        self.conns.pop(conn.sock.fileno(), None)
        conn.sock.close()
        run = conn.run
        if run is None:
            return
        with self._lock:
            run.connected = False
            self.store.sql(
                "UPDATE runs SET ended_ns = ? WHERE run_id = ?", [time.monotonic_ns(), run.run_id]
            )
        self.on_run_end(run.run_id)
        if not any(c.pid == conn.pid for c in self.conns.values()):
            self.on_untrack(conn.pid)
        log.info("run %d: pid %d disconnected", run.run_id, conn.pid)

    # ----- decode ------------------------------------------------------------------
    def decode_pending(self):
        """Turn every run's queued record bytes into column batches for the store."""
        with self._lock:
            work = []
            for run in self.runs.values():
                if run.chunks:
                    work.append((run, run.chunks, run.first_seqs, run.counts, list(run.names)))
                    run.chunks, run.first_seqs, run.counts = [], [], []
                    run.unflushed = True
            losses, self._losses = self._losses, []
        if losses:
            cols = list(zip(*losses))
            self.store.append(
                "losses",
                {
                    "run_id": np.array(cols[0], dtype=np.int64),
                    "probe": ["client"] * len(losses),
                    "start_ns": np.array(cols[1], dtype=np.int64),
                    "end_ns": np.array(cols[2], dtype=np.int64),
                    "count": np.array(cols[3], dtype=np.int64),
                    "reason": list(cols[4]),
                },
            )
        for run, chunks, first_seqs, counts, names in work:
            self._decode_run(run, chunks, first_seqs, counts, names)
        with self._lock:
            # Taken after decoding, so that what decoding rejected is written
            # now, not one decode later (or never, at shutdown).
            rejections, self._pending_rejections = self._pending_rejections, Counter()
        updates = []
        for run in list(self.runs.values()):
            if run.unflushed:
                run.unflushed = False
                updates.append((run.run_id, run.expected_seq - 1, run.records))
        if updates:
            # One statement for every run (not one each: ~2.5 ms apiece).
            ids, last, recs = (list(c) for c in zip(*updates))
            self.store.sql(
                "UPDATE runs SET last_seq = u.last_seq, records = u.records "
                "FROM (SELECT unnest(?::BIGINT[]) AS run_id, "
                "unnest(?::BIGINT[]) AS last_seq, unnest(?::BIGINT[]) AS records) u "
                "WHERE runs.run_id = u.run_id",
                [ids, last, recs],
            )
        if rejections:
            now = time.monotonic_ns()
            keys = list(rejections)
            self.store.append(
                "ingest_errors",
                {
                    "ts_ns": np.full(len(keys), now, dtype=np.int64),
                    "run_id": [k[0] for k in keys],
                    "pid": [k[1] for k in keys],
                    "reason": [k[2] for k in keys],
                    "count": [rejections[k] for k in keys],
                },
            )

    def _decode_run(self, run, chunks, first_seqs, counts, names):
        recs = np.frombuffer(b"".join(chunks), dtype=RECORD_DTYPE)
        # Sequence number of each record: its datagram's first_seq plus its
        # index among that datagram's sequence-carrying (non-string) records.
        counts = np.asarray(counts, dtype=np.int64)
        carries = (recs["rtype"] != wire.REC_STRING).astype(np.int64)
        running = np.cumsum(carries) - carries
        chunk_start = np.repeat(np.cumsum(counts) - counts, counts)
        seq = (
            np.repeat(np.asarray(first_seqs, dtype=np.int64), counts)
            + running
            - running[chunk_start]
        )

        name_table = np.array(names, dtype=object)

        def lookup(ids):
            ids = ids.astype(np.int64)
            known = ids < len(name_table)
            return name_table[np.where(known, ids, 0)], int((~known).sum())

        spans = recs[recs["rtype"] == wire.REC_SPAN]
        gcs = recs[recs["rtype"] == wire.REC_GC]
        span_seq = seq[recs["rtype"] == wire.REC_SPAN]
        gc_seq = seq[recs["rtype"] == wire.REC_GC]
        run_id = run.run_id

        if len(spans):
            ok = spans["end_ns"] >= spans["start_ns"]
            if not ok.all():
                self._reject(run_id, run.pid, "span_end_before_start", int((~ok).sum()))
                spans, span_seq = spans[ok], span_seq[ok]
            kinds, bad_k = lookup(spans["kind_id"])
            stages, bad_s = lookup(spans["a"])
            if bad_k or bad_s:
                self._reject(run_id, run.pid, "unknown_string_id", bad_k + bad_s)
            self.store.append(
                "spans",
                {
                    "run_id": np.full(len(spans), run_id, dtype=np.int64),
                    "tid": spans["tid"].astype(np.int64),
                    "kind": kinds,
                    "stage": stages,
                    "batch": spans["b"].astype(np.int64),
                    "start_ns": spans["start_ns"].astype(np.int64),
                    "end_ns": spans["end_ns"].astype(np.int64),
                    "depth": spans["flags"].astype(np.int16),
                    "seq": span_seq,
                },
            )
        if len(gcs):
            ok = (gcs["flags"] <= 2) & (gcs["end_ns"] >= gcs["start_ns"])
            if not ok.all():
                self._reject(run_id, run.pid, "bad_gc_record", int((~ok).sum()))
                gcs, gc_seq = gcs[ok], gc_seq[ok]
            self.store.append(
                "gc_events",
                {
                    "run_id": np.full(len(gcs), run_id, dtype=np.int64),
                    "tid": gcs["tid"].astype(np.int64),
                    "generation": gcs["flags"].astype(np.int8),
                    "start_ns": gcs["start_ns"].astype(np.int64),
                    "end_ns": gcs["end_ns"].astype(np.int64),
                    "collected": gcs["a"].astype(np.int64),
                    "uncollectable": gcs["b"].astype(np.int64),
                    "seq": gc_seq,
                },
            )
        run.records += len(spans) + len(gcs)

    # ----- shutdown ------------------------------------------------------------------
    def close(self):
        """Stop accepting, read what is queued, decode it (the caller flushes).

        Connections waiting in the listen backlog and every datagram already
        queued on a connection hold records clients consider sent: all are
        read (for at most `SHUTDOWN_DRAIN_S`, as clients may keep sending)."""
        self._accept()
        try:
            self.selector.unregister(self.listener)
        except (KeyError, ValueError):
            pass
        self.listener.close()
        deadline = time.monotonic() + SHUTDOWN_DRAIN_S
        pending = list(self.conns.values())
        while pending and time.monotonic() < deadline:
            pending = [conn for conn in pending if self._read(conn)]
        self.decode_pending()
        for conn in list(self.conns.values()):
            self._close(conn)
        self.decode_pending()
        if self.socket_path:
            try:
                os.unlink(self.socket_path)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    log.warning("could not remove %s: %s", self.socket_path, exc)

    def forget_runs(self, run_ids):
        """Drop what is kept in memory for runs retention deleted (ended runs
        only: a connected run keeps its state and its rows)."""
        gone = set(run_ids)
        with self._lock:
            for key, run in list(self.runs_by_token.items()):
                if run.run_id in gone and not run.connected:
                    del self.runs_by_token[key]
            for run_id in gone:
                run = self.runs.get(run_id)
                if run is not None and not run.connected and not run.chunks:
                    del self.runs[run_id]

    def status(self):
        return {
            "connections": len(self.conns),
            "datagrams": self.datagrams,
            "records_received": self.records_received,
            "lost_records": self.lost_records,
            "rejections": dict(self.rejections),
        }


def _int(v, bits=64):
    """A client-supplied number as an int that fits a signed `bits` column, else None."""
    try:
        n = int(v) if v is not None else None
    except (TypeError, ValueError, OverflowError):
        return None
    if n is not None and not -(1 << (bits - 1)) <= n < (1 << (bits - 1)):
        return None
    return n
