"""Probe ingest: the SOCK_SEQPACKET listener, its connections and datagram checks.

Accepts probe connections, records the kernel's view of the peer
(SO_PEERCRED: pid, uid, gid; never a pid the client claims), checks every
datagram's header and sequence numbers, and queues raw record bytes per run
for `RecordDecoder.decode_pending()` (ingest_records.py); HELLOs go to
`RunRegistry` (ingest_runs.py). Malformed input is rejected, counted by
reason, and never disturbs other connections. Never blocks: sockets are
non-blocking and the loop is driven by a selector.
"""

import array
import errno
import logging
import os
import select
import selectors
import socket
import stat
import struct
import threading
import time
from collections import Counter

from probe_client import wire
from stallscope.errors import ConfigError, ServiceError
from stallscope.ingest.census import CensusIngest
from stallscope.ingest.pystate import PyStateIngest
from stallscope.ingest.ratelog import RateLimitedLog
from stallscope.ingest.records import RecordDecoder
from stallscope.ingest.request_events import RequestDecoder
from stallscope.ingest.runs import RunRegistry
from stallscope.ingest.sockets import bind_listening, prepare_path
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

_PEERCRED = struct.Struct("3i")
_INT64_MAX = (1 << 63) - 1
# Sequence numbers at or above this are rejected (`seq_out_of_range`): they
# are stored as BIGINT, and no client makes 2^62 records.
SEQ_LIMIT = 1 << 62
# The fair reader's bounds per selector round.
DATAGRAMS_PER_ROUND = 256  # per connection
ACCEPTS_PER_ROUND = 32  # new connections
# A client's socket holds about this many 4 KiB datagrams (its send buffer).
SOCKET_HOLDS_DATAGRAMS = 46
# The longest a reader at idle priority may wait for a CPU before clients'
# sockets must still hold what arrived meanwhile: measured p99 185 ms, max
# 362 ms on two CPUs busy at nice 0 (load average 8).
IDLE_WAIT_S = 0.4
CONN_LOGS_PER_S = 20
# How long shutdown keeps reading what clients already sent.
SHUTDOWN_DRAIN_S = 1.0
_RECV_MAX = wire.HEADER_SIZE + wire.HELLO_MAX
_TYPE_SPAN = bytes([wire.REC_SPAN])
_TYPE_GC = bytes([wire.REC_GC])
_TYPE_STRING = bytes([wire.REC_STRING])
_TYPE_EXT = bytes([wire.REC_SPAN_EXT])
_TYPE_COUNTERS = bytes([wire.REC_COUNTERS])
_TYPE_REQUEST = bytes([wire.REC_REQUEST])
_TYPE_REQUEST_TEXT = bytes([wire.REC_REQUEST_TEXT])
_V2_TYPES = (wire.REC_SPAN_EXT, wire.REC_COUNTERS)
_V4_TYPES = (wire.REC_REQUEST, wire.REC_REQUEST_TEXT)
_U64 = struct.Struct("<Q")
# A HELLO may carry one descriptor: the client's tally page (wire.TALLY).
_CMSG_ONE_FD = socket.CMSG_SPACE(array.array("i").itemsize)


class Connection:
    __slots__ = (
        "sock",
        "pid",
        "uid",
        "gid",
        "run",
        "closing",
        "hello",
        "pylayout",
        "window_start",
        "window_datagrams",
        "rate",
        "first",
        "tally_fd",
    )

    def __init__(self, sock, pid, uid, gid):
        self.sock = sock
        self.pid = pid
        self.uid = uid
        self.gid = gid
        self.run = None
        self.closing = False
        self.hello = None  # what the HELLO claimed that later datagrams are checked against
        self.pylayout = False  # a PYLAYOUT of this connection was accepted
        # datagrams a second, over windows of RATE_WINDOW_S (None until one
        # window is complete: a new connection's rate is not known yet)
        self.window_start = time.monotonic()
        self.window_datagrams = 0
        self.rate = None
        self.first = True  # its first datagram (the HELLO) not read yet
        self.tally_fd = -1  # the client's tally page, when its HELLO passed one

    def datagram_rate(self, now):
        """Its datagrams a second: the larger of the last complete window's
        and the current one's (once it is a tenth of a window old), or None
        while no window is complete. The current window counts datagrams
        read, and a read after a light round's gather takes what was sent
        over the LIGHT_ROUND_GAP_S before it: so its rate is over the window
        and that gap. (Over the window alone, a 200 ms gather of a client
        sending 45 a second, read 0.1 s into a window, read as 90 a second;
        the main loop then took the client for a fast one and woke for each
        datagram for the rest of the window.)"""
        elapsed = now - self.window_start
        if elapsed >= RATE_WINDOW_S:
            self.rate = self.window_datagrams / elapsed
            self.window_start, self.window_datagrams = now, 0
            return self.rate
        if self.rate is None:
            return None
        if elapsed >= RATE_WINDOW_S / 10:
            return max(self.rate, self.window_datagrams / (elapsed + LIGHT_ROUND_GAP_S))
        return self.rate


RATE_WINDOW_S = 1.0
# How long the main loop lets datagrams gather on slow connections between
# two reads (service.server: a light round).
LIGHT_ROUND_GAP_S = 0.2


_WAKE = object()  # the selector key of Ingest's wake-up pipe


class Ingest(RunRegistry, RecordDecoder, RequestDecoder, CensusIngest, PyStateIngest):
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
        socket_group=None,
        on_run_end=None,
        on_watch=None,
        on_stacks=None,
        on_step_threads=None,
        on_pylayout=None,
        on_pythreads=None,
        proc_root="/proc",
        run_defaults=None,
        request_open_timeout_s=600.0,
    ):
        self.store = store
        # runs columns the daemon fills for every new run (how its probes
        # measure it, e.g. page_fault_method), not the client
        self.run_defaults = dict(run_defaults or {})
        self.socket_path = socket_path
        self.host = host or socket.gethostname()
        self.allowed_uids = set(allowed_uids) if allowed_uids else None
        # on_track(pid, run_id) for every run (re)connected, on_run_end(run_id)
        # for every run whose connection closed, on_untrack(pid) once no
        # connection of the process is left.
        self.on_track = on_track or (lambda pid, run_id=None: None)
        self.on_untrack = on_untrack or (lambda pid: None)
        self.on_run_end = on_run_end or (lambda run_id: None)
        # on_watch(conn, datagram): a WATCH request (service/watch.py answers it).
        self.on_watch = on_watch
        # on_stacks(conn, datagram): a STACKS request (service/hang.py answers it).
        self.on_stacks = on_stacks
        # on_step_threads(pid, tids): threads seen emitting spans for the first time.
        self.on_step_threads = on_step_threads
        # The CPU sampler's report (pystate.py): on_pylayout(pid, run_id, info)
        # returns None (accepted) or why not; on_pythreads(pid, run_id,
        # [(tid, tstate)], more) gets the threads that are the peer's own.
        self.on_pylayout = on_pylayout
        self.on_pythreads = on_pythreads
        self.proc_root = proc_root
        self.selector = selectors.DefaultSelector()
        self.conns = {}  # fd -> Connection
        self.runs = {}  # run_id -> RunState (what decode_pending walks)
        self.runs_by_token = {}  # (client token, kernel pid) -> RunState, for resuming
        self.rejections = Counter()
        self._pending_rejections = Counter()  # (run_id, pid, reason) -> n
        self._losses = []  # (run_id, start_ns, end_ns, count, reason) to append
        self._log_conn = RateLimitedLog(log, CONN_LOGS_PER_S, "connection messages").info
        self._new_runs = []  # runs rows to insert with the next decode
        self._run_changes = {}  # run_id -> [connections added, ended_ns or None]
        self.datagrams = 0
        self._peak_read = 0  # most datagrams one connection had queued in a round
        self.records_received = 0
        self.tally_tails = 0  # tails counted from a tally page (no BYE came)
        self.lost_records = 0
        self._lock = threading.Lock()  # guards run state between loop and decode
        self._progress = {}  # run_id -> (last_seq, records): progress_statements
        self._progress_lock = threading.Lock()
        self.undecoded = 0  # records read and queued for decode_pending
        self._changes = 0  # datagrams, closes and rejections so far
        self._changes_decoded = 0  # ... as of the latest decode_pending
        # A monotonic time before which everything clients sent has been read
        # and decoded into the store (its listeners saw it); 0 before the
        # first complete round. Behind the clock while ingest is behind (a
        # main loop at idle priority waiting for a CPU): the hang detector
        # judges silence up to here, never from the clock alone. Written by
        # the loop's thread only (poll, decode_pending), read by any.
        self.caught_up_ns = 0
        self._read_upto_ns = 0  # the select of the latest complete poll round
        self._next_run_id = self._max_run_id() + 1
        self._db_pids = self._pids_with_runs()  # pids a run could be resumed for
        self.listener = self._open_listener(socket_path, listen_fd, socket_group)
        if listen_fd is not None:
            # The socket file belongs to whoever passed the descriptor (systemd):
            # removing it at exit would break the next socket activation.
            self.socket_path = None
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        # wake(): a byte here ends a poll() at once (a stop request; the
        # select is otherwise resumed after a signal handler, up to its timeout)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        store.add_flush_hook(self.progress_statements)
        self._init_requests(store, request_open_timeout_s)

    # ----- set-up ------------------------------------------------------------
    def _max_run_id(self):
        cur = self.store.cursor()
        try:
            return cur.execute("SELECT coalesce(max(run_id), 0) FROM runs").fetchone()[0]
        finally:
            cur.close()

    def _pids_with_runs(self):
        cur = self.store.cursor()
        try:
            return {r[0] for r in cur.execute("SELECT DISTINCT pid FROM runs").fetchall()}
        finally:
            cur.close()

    def _open_listener(self, path, listen_fd, group):
        if listen_fd is not None:
            sock = socket.socket(fileno=listen_fd)
            if sock.type != socket.SOCK_SEQPACKET:
                raise ConfigError(
                    f"inherited probe socket (fd {listen_fd}) is not "
                    "SOCK_SEQPACKET; use ListenSequentialPacket= in the unit"
                )
            sock.setblocking(False)
            return sock
        if not path:
            raise ConfigError("no probe socket path given (--socket)")
        if not prepare_path(path, socket.SOCK_SEQPACKET):
            raise ServiceError(f"another daemon is listening on {path}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        bind_listening(sock, path, backlog=128, mode=0o660, group=group)
        sock.setblocking(False)
        return sock

    # ----- event loop ----------------------------------------------------------
    def poll(self, timeout):
        """Serve sockets for up to `timeout` seconds (one selector round);
        returns the number of datagrams read."""
        before = self.datagrams
        selected_ns = time.monotonic_ns()
        complete = True
        for key, _ in self.selector.select(timeout):
            if key.data is None:
                self._accept(ACCEPTS_PER_ROUND)
            elif key.data is _WAKE:
                try:
                    os.read(self._wake_r, 4096)
                except OSError:
                    pass
            elif self._read(key.data):
                complete = False
        if complete:
            # Every connection was read until its socket was empty: whatever
            # a client sent before the select is read now.
            self._read_upto_ns = selected_ns
            if not self.has_pending():
                self.caught_up_ns = selected_ns
        return self.datagrams - before

    def slow_enough(self, gap_s, max_backlog):
        """Whether every connection is known to send so few datagrams that
        `gap_s` without a read queues at most `max_backlog` of them on it (a
        socket holds ~46 datagrams of 4 KiB). A connection of less than a
        rate window, or one sending faster, says no: the daemon then reads
        it round after round instead of gathering."""
        now = time.monotonic()
        for conn in self.conns.values():
            rate = conn.datagram_rate(now)
            if rate is None or rate * gap_s > max_backlog:
                return False
        return True

    def pace_backlog(self):
        """The reader's backlog gauge (stallscope.threads.paced): 1.0 while a
        connection is new or sends so fast that an idle-priority wait would
        let its socket fill; otherwise the fullest connection's queue, as a
        share of what its socket holds, since the last call."""
        peak, self._peak_read = self._peak_read, 0
        if not self.slow_enough(IDLE_WAIT_S, SOCKET_HOLDS_DATAGRAMS // 2):
            return 1.0
        return peak / SOCKET_HOLDS_DATAGRAMS

    def sleep(self, timeout):
        """Wait `timeout` seconds, or less if wake() is called (by a signal
        handler too: the wait takes no lock). A wake-up already pending ends
        it at once and stays for poll() to read."""
        try:
            select.select([self._wake_r], [], [], timeout)
        except (OSError, ValueError):  # closed: nothing left to wake it
            time.sleep(timeout)

    def wake(self):
        """End the current poll() now; safe in a signal handler."""
        try:
            os.write(self._wake_w, b"w")
        except OSError:  # full (a wake is pending anyway) or closed
            pass

    def _accept(self, limit=None):
        # Bounded per round like reads: a flood of new connections waits in
        # the listen backlog instead of delaying the connections being read.
        for _ in range(limit or 1 << 30):
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
            stale = self.conns.get(sock.fileno())
            if stale is not None:
                self._lost_behind_our_back(stale)
            conn = Connection(sock, pid, uid, gid)
            self.conns[sock.fileno()] = conn
            self.selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn):
        sock = conn.sock
        # Bounded, whatever the datagrams hold (valid, rejected, a HELLO, EOF),
        # so one busy client cannot starve the others.
        for n in range(DATAGRAMS_PER_ROUND):
            try:
                data = self._recv_first(conn) if conn.first else sock.recv(_RECV_MAX)
            except (BlockingIOError, InterruptedError):
                self._peak_read = max(self._peak_read, n)
                return
            except OSError:
                data = b""
            if not data:
                self._close(conn)
                return
            conn.window_datagrams += 1
            try:
                self._datagram(conn, data)
            except Exception:
                if self.rejections["internal_error"] < 10:
                    log.exception("bug: datagram from pid %d could not be handled", conn.pid)
                self._reject(conn.run.run_id if conn.run else None, conn.pid, "internal_error")
            if conn.closing:
                self._close(conn)
                return
        self._peak_read = DATAGRAMS_PER_ROUND
        return True  # the bound was hit: more may be waiting

    def _recv_first(self, conn):
        """The connection's first datagram, with the descriptor a HELLO may
        pass (the tally page). A descriptor that is not a client's tally
        memfd is closed and counted (`bad_tally`); more than one cannot
        arrive (the control buffer holds one; the kernel closes the rest)."""
        data, ancillary, _flags, _addr = conn.sock.recvmsg(_RECV_MAX, _CMSG_ONE_FD)
        conn.first = False
        for level, kind, payload in ancillary:
            if level != socket.SOL_SOCKET or kind != socket.SCM_RIGHTS:
                continue
            fds = array.array("i")
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
            for fd in fds:
                if conn.tally_fd < 0 and _is_tally(fd):
                    conn.tally_fd = fd
                    continue
                os.close(fd)
                self._reject(None, conn.pid, "bad_tally")
        return data

    def _tally_tail(self, conn):
        """A connection that ended without a BYE: when its client closed (the
        page says so) or its process is gone, and no other connection of the
        run is open, records the page numbers beyond the last datagram read
        are the run's tail (`client_tail`), lost like a BYE's. A client that
        lives on will reconnect and its next datagram shows the gap."""
        run = conn.run
        try:
            raw = os.pread(conn.tally_fd, wire.TALLY.size, 0)
        except OSError:
            return
        if len(raw) < wire.TALLY.size or run is None:
            return
        next_seq, closed = wire.TALLY.unpack(raw)
        if next_seq >= SEQ_LIMIT or not (closed == 1 or _process_gone(conn.pid)):
            return
        if any(c.run is run for c in self.conns.values()):
            return
        with self._lock:
            if next_seq > run.expected_seq:
                now = time.monotonic_ns()
                self._loss(run, next_seq - run.expected_seq, run.last_sent_ns or now, now,
                           "client_tail")  # fmt: skip
                run.expected_seq = next_seq
                run.unflushed = True
                self.tally_tails += 1

    def drain(self):
        """Read everything already queued on every connection (shutdown)."""
        self._accept()
        for conn in list(self.conns.values()):
            self._read(conn)

    # ----- datagrams -------------------------------------------------------------
    def _datagram(self, conn, data):
        self.datagrams += 1
        self._changes += 1
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
        if version not in wire.VERSIONS:
            # A newer client than this daemon: say so, not just "bad".
            reason = "unsupported_version" if version > wire.VERSION else "bad_version"
            return self._reject(run_id, conn.pid, reason)
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
                    # last datagram (a full socket at close) are the run's
                    # tail: no later datagram will ever show that gap.
                    if first_seq > run.expected_seq:
                        missing = first_seq - run.expected_seq
                        self._loss(
                            run, missing, run.last_sent_ns or sent_ns, sent_ns, "client_tail"
                        )
                        run.expected_seq = first_seq
                        run.unflushed = True
                    run.drops_full, run.drops_disconnected = drops_full, drops_disc
            return None
        if kind in (wire.DGRAM_WATCH, wire.DGRAM_STACKS):
            handle = self.on_watch if kind == wire.DGRAM_WATCH else self.on_stacks
            if run is not None or handle is None:
                return self._reject(run_id, conn.pid, "bad_kind")
            return handle(conn, data)
        if kind in (wire.DGRAM_EVENT, wire.DGRAM_CENSUS):
            if run is None:
                return self._reject(None, conn.pid, "no_hello")
            handle = self._event if kind == wire.DGRAM_EVENT else self._census
            return handle(run, data, conn.pid)
        if kind in (wire.DGRAM_PYLAYOUT, wire.DGRAM_PYTHREADS) and version >= 3:
            if run is None:
                return self._reject(None, conn.pid, "no_hello")
            if kind == wire.DGRAM_PYLAYOUT:
                return self._pylayout(conn, data)
            return self._pythreads(conn, data, count, rsize)
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
        n_ext = n_counters = 0
        if version >= 2:
            n_ext = types.count(_TYPE_EXT)
            n_counters = types.count(_TYPE_COUNTERS)
        elif _TYPE_EXT in types or _TYPE_COUNTERS in types:
            data = _unknown_types(data, count, _V2_TYPES)  # in v1 these are unknown types
        if version < 4 and (_TYPE_REQUEST in types or _TYPE_REQUEST_TEXT in types):
            data = _unknown_types(data, count, _V4_TYPES)  # and these before v4
        n_seq = count - n_strings - n_ext - n_counters
        if first_seq >= SEQ_LIMIT:
            return self._reject(run_id, conn.pid, "seq_out_of_range")
        with self._lock:
            if first_seq < run.expected_seq:
                return self._reject(run_id, conn.pid, "seq_regress")
            if n_counters:
                self._gc_ring_counter(run, data, types)
            if first_seq > run.expected_seq:
                missing = first_seq - run.expected_seq
                ring = min(missing, run.drops_gc_ring - run.drops_gc_ring_reported)
                if ring > 0:
                    # The client's GC ring overflowed: its own loss reason.
                    run.drops_gc_ring_reported += ring
                    self._loss(
                        run, ring, run.last_sent_ns or sent_ns, sent_ns, "client_gc_ring_full"
                    )
                    missing -= ring
                if missing:
                    self._gap(run, missing, sent_ns, drops_full, drops_disc)
                # Counted once: a datagram of only STRING records (sent after
                # a drop, before the records that use the new name) carries
                # the gap too, and the next datagram must not count it again.
                run.expected_seq = first_seq
            run.drops_full, run.drops_disconnected = drops_full, drops_disc
            run.last_sent_ns = sent_ns
            if n_strings:
                self._strings(run, data, count)
            if n_ext and not n_seq:
                self._reject(run_id, conn.pid, "orphan_span_ext", n_ext)
            if n_seq:
                n_unknown = n_seq - types.count(_TYPE_SPAN) - types.count(_TYPE_GC)
                if version >= 4:
                    n_unknown -= types.count(_TYPE_REQUEST) + types.count(_TYPE_REQUEST_TEXT)
                if n_unknown:
                    self._reject(run_id, conn.pid, "unknown_record_type", n_unknown)
                run.chunks.append(data[wire.HEADER_SIZE :])
                run.first_seqs.append(first_seq)
                run.counts.append(count)
                run.expected_seq = first_seq + n_seq
                self.records_received += n_seq
                self.undecoded += n_seq
        return None

    def _gc_ring_counter(self, run, data, types):
        """The client's running count of GC records its ring dropped (the
        last COUNTERS record of the datagram)."""
        i = types.rfind(_TYPE_COUNTERS)
        (total,) = _U64.unpack_from(data, wire.HEADER_SIZE + i * wire.RECORD_SIZE + 8)
        run.drops_gc_ring = max(run.drops_gc_ring, min(total, SEQ_LIMIT))

    def _reject(self, run_id, pid, reason, n=1):
        self._changes += 1
        self.rejections[reason] += n
        self._pending_rejections[(run_id, pid, reason)] += n
        if self.rejections[reason] == n or self.rejections[reason] % 10000 == 0:
            log.warning("rejected %s from pid %s (%d so far)", reason, pid, self.rejections[reason])
        return None

    def _lost_behind_our_back(self, stale):
        """A new connection got the descriptor number of one still open here:
        something else in the daemon closed that one's socket (a library
        closing a descriptor it does not own; bcc < 0.33's symbolizer did,
        cpu_stacks.py). The old connection is gone: its run ends now, what
        its client sent since the last read is lost (an `ingest_errors` row
        says so), and its socket object lets go of the number without
        closing it, which is the new connection's now."""
        fd = stale.sock.fileno()
        log.error(
            "bug: the socket of pid %d's connection (fd %d) was closed by something else "
            "in the daemon; its run ends here and what it sent since the last read is lost",
            stale.pid,
            fd,
        )
        self._reject(stale.run.run_id if stale.run else None, stale.pid, "socket_closed_elsewhere")
        self._close(stale, release=True)

    def _close(self, conn, release=False):
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        self.conns.pop(conn.sock.fileno(), None)
        if release:
            conn.sock.detach()  # the number is someone else's now: never close it
        else:
            conn.sock.close()
        if conn.tally_fd >= 0:
            if not conn.closing:  # a BYE said it all: the page only where none came
                self._tally_tail(conn)
            os.close(conn.tally_fd)
            conn.tally_fd = -1
        run = conn.run
        if run is None:
            return
        self._changes += 1
        with self._lock:
            run.connected = False
            change = self._run_changes.setdefault(run.run_id, [0, None])
            change[1] = time.monotonic_ns()  # written with the next decode
        self.on_run_end(run.run_id)
        if not any(c.pid == conn.pid for c in self.conns.values()):
            self.on_untrack(conn.pid)
        self._log_conn("run %d: pid %d disconnected", run.run_id, conn.pid)

    # ----- shutdown ------------------------------------------------------------------
    def close(self):
        """Stop accepting, read what is queued, decode it (the caller flushes).

        Every datagram a client's send() accepted must be read or its loss
        reported: so no connection may appear, and no datagram be queued,
        after the last read. New connections are refused first (the path is
        removed and our own listener shut for reading; an inherited listener
        is left to systemd, which keeps its queue for the next start), the
        backlog is accepted, then each connection is shut for reading (a
        client's later send() fails with EPIPE and counts as a drop it will
        report) and read to its end, for at most `SHUTDOWN_DRAIN_S`."""
        if self.socket_path:
            try:
                os.unlink(self.socket_path)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    log.warning("could not remove %s: %s", self.socket_path, exc)
            try:
                self.listener.shutdown(socket.SHUT_RD)
            except OSError:
                pass
        self._accept()
        try:
            self.selector.unregister(self.listener)
        except (KeyError, ValueError):
            pass
        self.listener.close()
        for conn in list(self.conns.values()):
            try:
                conn.sock.shutdown(socket.SHUT_RD)
            except OSError:
                pass
        deadline = time.monotonic() + SHUTDOWN_DRAIN_S
        pending = list(self.conns.values())
        while pending and time.monotonic() < deadline:
            # _read is True while it read something: after SHUT_RD nothing new
            # can arrive, so a connection is done at its first empty read.
            pending = [conn for conn in pending if conn.sock.fileno() >= 0 and self._read(conn)]
        self.decode_pending()
        for conn in list(self.conns.values()):
            self._close(conn)
        self.decode_pending()
        try:
            self.selector.unregister(self._wake_r)
        except (KeyError, ValueError):
            pass
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._wake_r = self._wake_w = -1

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


def _unknown_types(data, count, types):
    """A datagram of a version that predates record `types` (so there they
    are unknown, sequence-carrying types): mark them 0xFF so the decoder
    treats them as that version's daemon did."""
    buf = bytearray(data)
    for i in range(count):
        off = wire.HEADER_SIZE + i * wire.RECORD_SIZE
        if buf[off] in types:
            buf[off] = 0xFF
    return bytes(buf)


def _is_tally(fd):
    """A client's tally page: a memfd of that name, at least TALLY long."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
        st = os.fstat(fd)
    except OSError:
        return False
    return (
        target.startswith(f"/memfd:{wire.TALLY_NAME}")
        and stat.S_ISREG(st.st_mode)
        and st.st_size >= wire.TALLY.size
    )


def _process_gone(pid):
    """The peer's process has exited (no /proc entry, or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            st = f.read()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return st[st.rindex(b")") + 2 : st.rindex(b")") + 3] in (b"Z", b"X")
