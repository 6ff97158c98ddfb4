"""The probe's transport: the record buffer, the GC ring, the sends and close.

`Transport` is the base of `Probe`: it owns the preallocated datagram buffer
(records are packed into it under one lock; the optional C write of
`_accel.c` writes only while no thread holds it, the GIL making that write
atomic, so every section here that holds the lock is still alone), the
single-producer GC ring,
the sends of RECORDS (sequence numbers, drops, the COUNTERS record after a
GC ring overflow), the bounded wait for socket space at close and the BYE,
the background flusher thread and the fork and exit hooks; `_connection.py`
(its base) connects and sends HELLO and names. A send is one non-blocking
syscall on a memoryview made in advance: a full socket or an absent daemon
is a counted drop and a gap in the sequence numbers, never a wait (except
close()'s bounded one) and never an exception into the engine. Standard
library only; nothing here allocates a tracked object per record.
"""

import atexit
import os
import select
import socket
import threading
import time
import weakref

from . import wire
from ._connection import RECONNECT_INTERVAL_NS, Connection

FLUSH_INTERVAL_NS = 20_000_000  # an outermost span end sends if older than this
IDLE_FLUSH_S = 0.1  # the background flusher's period
# GC records wait here until a flush (a span end, the 100 ms flusher) or, past
# half full, the GC callback itself moves them into the buffer. 4096 slots
# (128 KiB) hold a burst of ~4,000 collections with no flush at all, e.g. an
# 800k-object heap built right after connect() (~1,150 gen-0 passes).
GC_RING_SLOTS = 4096
CLOSE_WAIT_ENV = "STALLSCOPE_CLOSE_WAIT_MS"
# Default bound on close()'s wait for socket space. It must outlast the
# daemon's longest pause between reads of a connection (light traffic is
# gathered for 200 ms, service/server.py LIGHT_ROUND_GAP_S; a test keeps the
# two in step): at 100 ms a burst that filled the socket right before close()
# lost its BYE, and with it the report of the tail it dropped.
CLOSE_WAIT_MS = 300
# The CPU sampler's thread-state report (_pythreads.py): made by the flusher
# at most this often, sent only when the thread list changed.
PYTHREADS_ENV = "STALLSCOPE_PYTHREADS"  # 0/off/no: no report
PYTHREADS_INTERVAL_ENV = "STALLSCOPE_PYTHREADS_INTERVAL_MS"
PYTHREADS_INTERVAL_MS = 1000

_monotonic_ns = time.monotonic_ns
_native_id = threading.get_native_id
_pack_header = wire.HEADER.pack_into
_pack_ext = wire.EXT_RECORD.pack_into
_pack_tally = wire.TALLY.pack_into
_REC_SPAN_EXT = wire.REC_SPAN_EXT
_REC_COUNTERS = wire.REC_COUNTERS
_HDR = wire.HEADER_SIZE
_RS = wire.RECORD_SIZE
_U32 = wire.U32_MAX
FULL_AT = wire.DATAGRAM_MAX - _RS  # a write needs room for a span and its SPAN_EXT
MOSTLY_FULL_AT = wire.HEADER_SIZE + (wire.MAX_RECORDS * 3 // 4) * wire.RECORD_SIZE

# Every open probe, held until close(): one dropped without close() still
# sends its last records and its BYE from the exit hook (with gc=True the GC
# callback held it anyway).
_live_probes = set()


class Transport(Connection):
    """Buffer, GC ring and connection of one probe (the base of `Probe`)."""

    def _init_buffers(self, close_wait_ms):
        if close_wait_ms is None:
            try:
                close_wait_ms = float(os.environ.get(CLOSE_WAIT_ENV, CLOSE_WAIT_MS))
            except ValueError:
                close_wait_ms = CLOSE_WAIT_MS
        self.close_wait_ns = max(0, int(close_wait_ms * 1_000_000))
        self._lock = threading.Lock()
        self._buf = bytearray(wire.DATAGRAM_MAX)
        # One memoryview per possible datagram length, made once, so that a
        # send never creates a (GC-tracked) memoryview.
        whole = memoryview(self._buf)
        self._views = tuple(whole[: _HDR + n * _RS] for n in range(wire.MAX_RECORDS + 1))
        self._gc_slots = GC_RING_SLOTS
        self._gc_half = GC_RING_SLOTS // 2
        self._gc_buf = bytearray(GC_RING_SLOTS * _RS)
        self._sock = None
        self._fd = -1
        self._write = None
        self._next_connect_ns = 0
        self._control = []  # EVENT and CENSUS datagrams not yet sent (_connection.py)
        self._conn_gen = 0  # connections made so far (_connection.py counts)
        self._tally = None  # the tally page's mapping (wire.TALLY; _connection.py)
        self._tally_fd = -1

    def _init_pythreads(self, pythreads):
        """The thread-state report: on unless `pythreads` is False or
        $STALLSCOPE_PYTHREADS says 0; nothing is made until the flusher's
        first tick with a daemon connected."""
        if pythreads is None:
            pythreads = os.environ.get(PYTHREADS_ENV, "1").strip().lower() not in ("0", "off", "no")
        self._pythreads_on = bool(pythreads)
        try:
            ms = float(os.environ.get(PYTHREADS_INTERVAL_ENV, PYTHREADS_INTERVAL_MS))
        except ValueError:
            ms = PYTHREADS_INTERVAL_MS
        self._pythreads_interval_ns = max(1, int(ms * 1_000_000))
        self._pythreads_next_ns = 0
        self._pyreporter = None  # _pythreads.Reporter, made by the first tick
        self._pyreport_gen = 0  # the connection the layout was sent on
        self.pythreads_errors = 0
        self.pythreads_sent = 0  # PYTHREADS datagrams sent

    def _pythreads_tick(self, now):
        """Flusher thread only (never the hot path): send this connection's
        PYLAYOUT once, then the thread list when it changed. The listing is
        made outside the buffer lock; the lock is only tried, for the sends."""
        rep = self._pyreporter
        if rep is None:
            from . import _pythreads

            rep = self._pyreporter = _pythreads.Reporter()  # one-time checks, ~15-100 ms
        if self._pyreport_gen != self._conn_gen:
            rep.forget_sent()
        dgram = rep.listing(lambda n: self._header(wire.DGRAM_PYTHREADS, n, now))
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._sock is None or self._strings_sent < len(self._names) or self._control:
                return  # names and queued events first: the next tick
            if self._pyreport_gen != self._conn_gen:
                layout = bytes(self._header(wire.DGRAM_PYLAYOUT, 0, now)) + rep.layout
                if not self._send_datagram(layout):
                    return
                self._pyreport_gen = self._conn_gen
            if dgram is not None and self._send_datagram(dgram):
                rep.sent()
                self.pythreads_sent += 1
        finally:
            self._lock.release()

    def _send_datagram(self, data):
        """One non-blocking send (lock held); False if it did not go."""
        try:
            self._sock.send(data, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        except BlockingIOError:
            return False
        except OSError:
            self._disconnect()
            return False
        return True

    def _reset_run_state(self):
        self.run_token = int.from_bytes(os.urandom(8), "little") >> 1
        self._pos = _HDR
        self._seqless = 0  # records in the buffer without a sequence number
        self._seq = 0  # sequence number of the buffer's first record
        self._last_send_ns = 0
        self._strings_sent = 0  # names already sent on this connection
        self.drops_full = 0  # records lost to a full socket
        self.drops_disconnected = 0  # records lost while no daemon was there
        self.connect_busy = 0  # connection tries the daemon's full backlog refused
        self.drops_gc_ring = 0  # GC records lost to a full GC ring
        self._gc_ring_told = 0  # drops_gc_ring as last sent in a COUNTERS record
        self._gc_ring_in_buf = -1  # the value in the buffer's COUNTERS record
        self.sent_records = 0
        self._gc_w = 0
        self._gc_r = 0
        self._gc_lost = 0
        self._gc_t0 = 0

    def _flush(self, now):
        self._lock.acquire()
        try:
            self._drain_gc_locked()
            self._send_locked(now)
        finally:
            self._lock.release()

    def _send_full_locked(self, now):
        self._drain_gc_locked()
        if self._pos >= FULL_AT:
            self._send_locked(now)

    def _drain_gc_locked(self, keep=False, send=True):
        """Move the GC ring's records into the buffer. `send=False` (from the
        GC callback itself) stops when the buffer is full instead of sending."""
        # Single producer (the GC callback, which CPython never re-enters)
        # and a consumer holding the lock: the producer fills a slot, then
        # advances _gc_w, so every slot below _gc_w is complete.
        r = self._gc_r
        w = self._gc_w
        buf = self._buf
        gcbuf = self._gc_buf
        slots = self._gc_slots
        while r < w:
            if self._pos >= FULL_AT and not (send and self._send_locked(_monotonic_ns(), keep)):
                self._gc_r = r
                return  # close() waits for space and comes back
            off = (r % slots) * _RS
            pos = self._pos
            buf[pos : pos + _RS] = gcbuf[off : off + _RS]
            self._pos = pos + _RS
            r += 1
        self._gc_r = r
        lost = self._gc_lost
        if lost and send:
            # Collections the ring could not hold: send what precedes them,
            # then skip their sequence numbers so the daemon sees the gap,
            # and say in a COUNTERS record that the ring, not the socket, lost them.
            if not self._send_locked(_monotonic_ns(), keep):
                return
            self._gc_lost = 0
            self._seq += lost
            if self._tally is not None:
                _pack_tally(self._tally, 0, self._seq, 0)
            self.drops_gc_ring += lost
            self._start_buffer_locked()

    def _start_buffer_locked(self):
        """An empty buffer starts with a COUNTERS record while the daemon has
        not been told the GC ring's latest losses."""
        if self.drops_gc_ring != self._gc_ring_told and self._pos == _HDR:
            _pack_ext(self._buf, _HDR, _REC_COUNTERS, 0, 0, 0, self.drops_gc_ring, 0, 0, 0)
            self._gc_ring_in_buf = self.drops_gc_ring
            self._pos = _HDR + _RS
            self._seqless = 1

    def _put_ext_locked(self, pos, work, idle):
        """The SPAN_EXT record after the span at pos - 32 (work, idle)."""
        flags = 0
        if work is not None:
            flags = wire.EXT_HAS_WORK
        else:
            work = 0
        if idle is not None:
            flags |= wire.EXT_HAS_IDLE | (wire.EXT_IDLE if idle else 0)
        _pack_ext(self._buf, pos, _REC_SPAN_EXT, flags, 0, 0, work, 0, 0, 0)
        self._pos = pos + _RS
        self._seqless += 1

    def _send_locked(self, now, keep=False):
        """Send the buffer; on a full socket drop it (counted), or with
        `keep` (close() only) leave it in place and return False."""
        n = (self._pos - _HDR) >> 5
        if n == 0:
            return True
        n_seq = n - self._seqless
        if self._sock is None or self._strings_sent < len(self._names):
            if not self._ensure_connected(now):
                if keep and self._sock is not None:
                    return False
                if self._sock is None:
                    self.drops_disconnected += n_seq
                else:
                    self.drops_full += n_seq
                self._seq += n_seq
                self._reset_buffer_locked(now)
                if self._tally is not None:
                    _pack_tally(self._tally, 0, self._seq, 0)
                return True
        _pack_header(
            self._buf,
            0,
            wire.MAGIC,
            wire.VERSION,
            wire.DGRAM_RECORDS,
            n,
            _RS,
            self._seq,
            now,
            self.drops_full & _U32,
            self.drops_disconnected & _U32,
        )
        try:
            self._write(self._fd, self._views[n])
            self.sent_records += n_seq
            if self._gc_ring_in_buf >= 0:
                self._gc_ring_told = self._gc_ring_in_buf
        except BlockingIOError:
            if keep:
                return False
            self.drops_full += n_seq
        except OSError:
            self.drops_disconnected += n_seq
            self._disconnect()
            self._next_connect_ns = now + RECONNECT_INTERVAL_NS
        self._seq += n_seq
        self._reset_buffer_locked(now)
        if self._tally is not None:  # one 16-byte store in a mapped page, no syscall
            _pack_tally(self._tally, 0, self._seq, 0)
        return True

    def _reset_buffer_locked(self, now):
        self._pos = _HDR
        self._seqless = 0
        self._gc_ring_in_buf = -1
        self._last_send_ns = now
        if self.drops_gc_ring != self._gc_ring_told:
            self._start_buffer_locked()

    def _close_transport(self):
        """Send what is left, then BYE, waiting for socket space at most
        `close_wait_ns` in all (the only wait the probe ever makes: at close
        and exit, never on the hot path). What still does not fit is a
        counted drop, and the BYE's sequence number reports it; so does the
        tally page, marked closed, where the BYE itself did not fit."""
        try:
            self._send_to_close()
        finally:
            with self._lock:
                if self._tally is not None:
                    _pack_tally(self._tally, 0, self._seq, 1)

    def _send_to_close(self):
        deadline = _monotonic_ns() + self.close_wait_ns
        final = self.close_wait_ns <= 0
        while True:
            with self._lock:
                now = _monotonic_ns()
                keep = not final
                self._drain_gc_locked(keep)
                done = self._gc_r == self._gc_w and not self._gc_lost
                done = self._send_locked(now, keep) and done
                if done and self._send_bye_locked():
                    return
                fd = self._fd
            if final or fd < 0:
                if fd < 0:
                    return
                with self._lock:
                    if self._tally is not None:  # closed before the EOF the daemon reads it at
                        _pack_tally(self._tally, 0, self._seq, 1)
                    self._disconnect()  # BYE did not fit: the daemon sees EOF
                return
            left_ms = (deadline - _monotonic_ns()) // 1_000_000
            if left_ms <= 0:
                final = True  # one last non-blocking try, dropping what is left
                continue
            try:
                poller = select.poll()
                poller.register(fd, select.POLLOUT)
                poller.poll(min(left_ms, 50))
            except (OSError, ValueError):
                final = True

    def _send_bye_locked(self):
        """BYE with the next sequence number; True once sent (or no socket)."""
        if self._sock is None:
            return True
        if self._control and not self._send_control():
            return self._sock is None  # socket full: wait (bounded) and come back
        try:
            self._sock.send(
                self._header(wire.DGRAM_BYE, 0, _monotonic_ns()),
                socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL,
            )
        except BlockingIOError:
            return False
        except OSError:
            pass
        self._disconnect()
        return True

    def _start_flusher(self):
        t = threading.Thread(
            target=_flusher_loop, args=(weakref.ref(self),), name="stallscope-flush", daemon=True
        )
        t.start()

    def _after_fork_child(self):
        # The child is its own run: new token, new connection, empty buffers.
        # The lock was taken before the fork and is released, not replaced:
        # wrappers hold its bound methods.
        self._local = threading.local()
        sock, self._sock = self._sock, None
        self._write = None
        if sock is not None:
            try:
                sock.close()  # the child's copy of the descriptor only
            except OSError:
                pass
        self._reset_run_state()
        self._drop_tally()  # the parent's page: the child's run gets its own
        self._control = []  # the parent's events and census belong to the parent's run
        self._pyreporter = None  # the parent's checks and thread states are not ours
        self._pyreport_gen = 0
        self._next_connect_ns = 0
        self._lock.release()
        if not self._closed:
            self._start_flusher()


def _flusher_loop(ref):
    # Sends what sits in the buffer when the engine goes idle (GC records in
    # particular) and reconnects when no daemon was there. time.sleep
    # allocates nothing; the lock is only tried, never waited for.
    while True:
        time.sleep(IDLE_FLUSH_S)
        probe = ref()
        if probe is None or probe._closed:
            return
        try:
            now = _monotonic_ns()
            pending = probe._pos > _HDR or probe._gc_w != probe._gc_r
            stale = now - probe._last_send_ns >= FLUSH_INTERVAL_NS
            if (pending and stale) or (probe._sock is None and now >= probe._next_connect_ns):
                if probe._lock.acquire(blocking=False):
                    try:
                        probe._drain_gc_locked()
                        if probe._pos > _HDR:
                            probe._send_locked(now)
                        elif probe._sock is None:
                            probe._ensure_connected(now)
                    finally:
                        probe._lock.release()
        except Exception:
            probe.errors += 1
        try:
            if probe._pythreads_on and probe._sock is not None and now >= probe._pythreads_next_ns:
                probe._pythreads_next_ns = now + probe._pythreads_interval_ns
                probe._pythreads_tick(now)
        except Exception:
            probe.pythreads_errors += 1
        del probe


def _before_fork():
    for probe in list(_live_probes):
        probe._lock.acquire()


def _after_fork_parent():
    for probe in list(_live_probes):
        probe._lock.release()


def _after_fork_child():
    for probe in list(_live_probes):
        probe._after_fork_child()


def _close_all():
    for probe in list(_live_probes):
        try:
            probe.close()
        except Exception:
            pass


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child
)
atexit.register(_close_all)
