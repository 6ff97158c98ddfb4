"""The probe's transport: the record buffer, the GC ring, the socket and its sends.

`Transport` is the base of `Probe`: it owns the preallocated datagram buffer
(records are packed into it under one lock), the single-producer GC ring,
the connection to the daemon (HELLO, names, RECORDS, BYE), reconnection at
most once a second, the background flusher thread and the fork and exit
hooks. A send is one non-blocking syscall on a memoryview made in advance:
a full socket or an absent daemon is a counted drop and a gap in the
sequence numbers, never a wait and never an exception into the engine.
Standard library only; nothing here allocates a tracked object per record.
"""

import atexit
import gc as _gc
import json
import os
import signal
import socket
import sys
import sysconfig
import threading
import time
import weakref

from . import wire

RECONNECT_INTERVAL_NS = 1_000_000_000  # at most one connection attempt a second
FLUSH_INTERVAL_NS = 20_000_000  # an outermost span end sends if older than this
IDLE_FLUSH_S = 0.1  # the background flusher's period
GC_RING_SLOTS = 256

_monotonic_ns = time.monotonic_ns
_native_id = threading.get_native_id
_pack_header = wire.HEADER.pack_into
_HDR = wire.HEADER_SIZE
_RS = wire.RECORD_SIZE
_U32 = wire.U32_MAX
FULL_AT = wire.DATAGRAM_MAX
MOSTLY_FULL_AT = wire.HEADER_SIZE + (wire.MAX_RECORDS * 3 // 4) * wire.RECORD_SIZE

_live_probes = weakref.WeakSet()


def _free_threaded():
    return (
        bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
        and not getattr(sys, "_is_gil_enabled", lambda: True)()
    )


class Transport:
    """Buffer, GC ring and connection of one probe (the base of `Probe`)."""

    def _init_buffers(self):
        self._lock = threading.Lock()
        self._buf = bytearray(wire.DATAGRAM_MAX)
        # One memoryview per possible datagram length, made once, so that a
        # send never creates a (GC-tracked) memoryview.
        whole = memoryview(self._buf)
        self._views = tuple(whole[: _HDR + n * _RS] for n in range(wire.MAX_RECORDS + 1))
        self._gc_buf = bytearray(GC_RING_SLOTS * _RS)
        self._sock = None
        self._fd = -1
        self._write = None
        self._next_connect_ns = 0

    def _reset_run_state(self):
        self.run_token = int.from_bytes(os.urandom(8), "little") >> 1
        self._pos = _HDR
        self._seq = 0  # sequence number of the buffer's first record
        self._last_send_ns = 0
        self._strings_sent = 0  # names already sent on this connection
        self.drops_full = 0  # records lost to a full socket or GC ring
        self.drops_disconnected = 0  # records lost while no daemon was there
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

    def _drain_gc_locked(self):
        # Single producer (the GC callback, which CPython never re-enters)
        # and a consumer holding the lock: the producer fills a slot, then
        # advances _gc_w, so every slot below _gc_w is complete.
        r = self._gc_r
        w = self._gc_w
        buf = self._buf
        gcbuf = self._gc_buf
        while r < w:
            if self._pos >= FULL_AT:
                self._send_locked(_monotonic_ns())
            off = (r % GC_RING_SLOTS) * _RS
            pos = self._pos
            buf[pos : pos + _RS] = gcbuf[off : off + _RS]
            self._pos = pos + _RS
            r += 1
        self._gc_r = r
        lost = self._gc_lost
        if lost:
            # Collections the ring could not hold: send what precedes them,
            # then skip their sequence numbers so the daemon sees the gap.
            self._gc_lost = 0
            self._send_locked(_monotonic_ns())
            self._seq += lost
            self.drops_full += lost

    def _send_locked(self, now):
        n = (self._pos - _HDR) >> 5
        if n == 0:
            return
        if self._sock is None or self._strings_sent < len(self._names):
            if not self._ensure_connected(now):
                if self._sock is None:
                    self.drops_disconnected += n
                else:
                    self.drops_full += n
                self._seq += n
                self._pos = _HDR
                self._last_send_ns = now
                return
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
            self.sent_records += n
        except BlockingIOError:
            self.drops_full += n
        except OSError:
            self.drops_disconnected += n
            self._disconnect()
            self._next_connect_ns = now + RECONNECT_INTERVAL_NS
        self._seq += n
        self._pos = _HDR
        self._last_send_ns = now

    def _header(self, kind, count, now):
        hdr = bytearray(_HDR)
        _pack_header(
            hdr,
            0,
            wire.MAGIC,
            wire.VERSION,
            kind,
            count,
            _RS,
            self._seq,
            now,
            self.drops_full & _U32,
            self.drops_disconnected & _U32,
        )
        return hdr

    def _ensure_connected(self, now):
        """Connect if needed and send the names the daemon lacks. Called with
        the lock held; at most one connection attempt per second."""
        if self._sock is None:
            if self._closed or now < self._next_connect_ns:
                return False  # closed: a straggling wrapper call must not reconnect
            self._next_connect_ns = now + RECONNECT_INTERVAL_NS
            if not self._connect():
                return False
        return self._send_strings()

    def _try_connect(self, now):
        with self._lock:
            self._next_connect_ns = now + RECONNECT_INTERVAL_NS
            if self._connect():
                self._send_strings()

    def _connect(self):
        sock = None
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            sock.setblocking(False)
            sock.connect(self.socket_path)
            sock.send(self._hello(), socket.MSG_NOSIGNAL)
        except OSError:
            if sock is not None:
                sock.close()
            return False
        self._sock = sock
        self._fd = sock.fileno()
        self._strings_sent = 0
        # os.write takes no argument tuple (socket.send does); use it when
        # SIGPIPE is ignored (CPython's default) so a dead peer is EPIPE, not
        # a signal. Otherwise send with MSG_NOSIGNAL.
        if signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN:
            self._write = os.write
        else:

            def _send(fd, data, _s=sock.send, _f=socket.MSG_NOSIGNAL):
                return _s(data, _f)

            self._write = _send
        return True

    def _send_strings(self):
        while self._strings_sent < len(self._names):
            chunk = self._names[self._strings_sent : self._strings_sent + wire.MAX_RECORDS]
            out = self._header(wire.DGRAM_RECORDS, len(chunk), _monotonic_ns())
            out.extend(bytes(len(chunk) * _RS))
            for i, name in enumerate(chunk):
                # String records carry no sequence number (only span and GC
                # records do); the header's first_seq is the next record's.
                wire.STRING_RECORD.pack_into(
                    out, _HDR + i * _RS, wire.REC_STRING, 0, self._strings_sent + i + 1, 0, name
                )
            try:
                self._sock.send(out, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            except BlockingIOError:
                return False  # socket full: try again at the next flush
            except OSError:
                self._disconnect()
                return False
            self._strings_sent += len(chunk)
        return True

    def _hello(self):
        now_mono = _monotonic_ns()
        info = {
            "pid": os.getpid(),
            "tid": _native_id(),
            "run_token": self.run_token,
            "label": self.run_label,
            "argv": list(sys.argv),
            "python": sys.version.split()[0],
            "implementation": sys.implementation.name,
            "free_threaded": _free_threaded(),
            "gc_threshold": list(_gc.get_threshold()),
            "gc_count": list(_gc.get_count()),
            "freeze_count": _gc.get_freeze_count() if hasattr(_gc, "get_freeze_count") else None,
            "gc_enabled": _gc.isenabled(),
            "gc_callback": self._want_gc,
            "realtime_ns": time.time_ns(),
            "monotonic_ns": now_mono,
            "client_version": 1,
        }
        data = json.dumps(info, separators=(",", ":")).encode()[: wire.HELLO_MAX]
        return bytes(self._header(wire.DGRAM_HELLO, 0, now_mono)) + data

    def _disconnect(self):
        sock, self._sock = self._sock, None
        self._write = None
        self._fd = -1
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

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
