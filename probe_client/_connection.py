"""The probe's connection to the daemon: connect, HELLO, names, disconnect.

`Connection` is a base of `Transport`: it opens the non-blocking SEQPACKET
socket (at most one attempt a second, every 10 ms while the daemon's listen
backlog is full; never when closed), sends the HELLO
that describes the process and run (with the GC knobs applied to it),
re-sends every interned name after each (re)connect, then the queued control
datagrams (EVENT, CENSUS), and picks the cheapest send function (os.write when SIGPIPE is
ignored). Called with the buffer lock held, from flushes and the flusher
thread; never from a GC callback, never blocking: a full socket makes a
name wait for the next flush, an error drops the connection.
"""

import array
import gc as _gc
import json
import mmap
import os
import signal
import socket
import sys
import sysconfig
import threading
import time

from . import wire

RECONNECT_INTERVAL_NS = 1_000_000_000  # at most one connection attempt a second
# ... but sooner while the daemon is there and its listen backlog is full
# (EAGAIN: busy accepting, e.g. a flood of connections): a client that waited
# a second per try could miss a busy daemon for its whole run. A refused try
# costs ~10-20 us, so at most ~0.2% of a thread while it lasts.
BUSY_RETRY_NS = 10_000_000
CONTROL_QUEUE_MAX = 64  # EVENT and CENSUS datagrams waiting for a connection

_monotonic_ns = time.monotonic_ns
_native_id = threading.get_native_id
_pack_header = wire.HEADER.pack_into
_pack_tally = wire.TALLY.pack_into
_HDR = wire.HEADER_SIZE
_RS = wire.RECORD_SIZE
_U32 = wire.U32_MAX


def _free_threaded():
    return (
        bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
        and not getattr(sys, "_is_gil_enabled", lambda: True)()
    )


class Connection:
    """Socket set-up and names of one probe (a base of `Transport`)."""

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
            if self._tally_fd < 0:
                self._open_tally()
            if self._tally_fd >= 0:
                fds = array.array("i", [self._tally_fd])
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]
                sock.sendmsg([self._hello()], ancillary, socket.MSG_NOSIGNAL)
            else:
                sock.send(self._hello(), socket.MSG_NOSIGNAL)
        except OSError as exc:
            if sock is not None:
                sock.close()
            if isinstance(exc, BlockingIOError):  # listening, backlog full
                self.connect_busy += 1
                self._next_connect_ns = _monotonic_ns() + BUSY_RETRY_NS
            return False
        self._sock = sock
        self._fd = sock.fileno()
        self._strings_sent = 0
        self._conn_gen += 1  # a new connection: the thread-state report is sent again
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

    def _open_tally(self):
        """The tally page (wire.TALLY): a one-page memfd, mapped here, passed
        with each HELLO. Without memfd (not Linux, a seccomp filter) there is
        none and a tail lost without a BYE stays unreported, as before."""
        fd = -1
        try:
            fd = os.memfd_create(wire.TALLY_NAME, os.MFD_CLOEXEC)
            os.ftruncate(fd, mmap.PAGESIZE)
            self._tally = mmap.mmap(fd, mmap.PAGESIZE)
        except (AttributeError, OSError, ValueError):
            if fd >= 0:
                os.close(fd)
            return
        self._tally_fd = fd
        _pack_tally(self._tally, 0, self._seq, 0)

    def _drop_tally(self):
        """After fork: the page is the parent's (the child makes its own)."""
        tally, fd = self._tally, self._tally_fd
        self._tally, self._tally_fd = None, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
        if tally is not None:
            try:
                tally.close()
            except (OSError, BufferError):
                pass

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
        if self._control:
            self._send_control()
        return True

    def _queue_control(self, kind, payload, now):
        """Queue one EVENT or CENSUS datagram (sent after HELLO and the
        names, in order); sent now if connected. Called with the lock held."""
        if len(self._control) < CONTROL_QUEUE_MAX:
            self._control.append(bytes(self._header(kind, 0, now)) + payload)
        if self._sock is not None and self._strings_sent >= len(self._names):
            self._send_control()

    def event(self, kind, target, message, ts_ns=None):
        """Queue one run event (EVENT datagram; `ts_ns`: when it happened,
        default now) and send it if connected; never raises. Not for the hot path."""
        try:
            now = _monotonic_ns()
            payload = json.dumps(
                {"kind": kind, "target": target, "message": message, "ts_ns": ts_ns or now},
                separators=(",", ":"),
            ).encode("utf-8", "replace")[: wire.HELLO_MAX]
            with self._lock:
                self._queue_control(wire.DGRAM_EVENT, payload, now)
        except Exception:
            self.errors += 1

    def _send_control(self):
        """Send queued control datagrams; False while some wait (socket full)."""
        while self._control and self._sock is not None:
            try:
                self._sock.send(self._control[0], socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            except BlockingIOError:
                return False  # socket full: the next flush, connection or close retries
            except OSError:
                self._disconnect()
                return False
            self._control.pop(0)
        return not self._control

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
            "client_version": wire.VERSION,
            "accelerator": getattr(self, "accelerator", "python"),  # record write: c or python
            "census": self._census is not None,
            "gc_knobs": self._gc_knobs,
            "pythreads": self._pythreads_on,  # sends PYLAYOUT / PYTHREADS (wire v3)
            # run groups (the daemon checks the parent against the kernel's ppid chain)
            "parent_pid": _parent_pid(),
            "group": os.environ.get("STALLSCOPE_GROUP") or None,
            "rank": _rank(),
            "hang_threshold_ms": _hang_threshold_ms(),  # the run's own hang threshold
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


def _parent_pid():
    """The traced process that started this one, as `stallscope run`'s
    sitecustomize handed it down ("PID:LABEL" in _STALLSCOPE_PARENT), or None."""
    pid = os.environ.get("_STALLSCOPE_PARENT", "").partition(":")[0]
    if not pid.isdigit() or int(pid) == os.getpid():
        return None
    return int(pid)


def _rank():
    """$STALLSCOPE_RANK, else $RANK (torchrun, ray), as an int, or None."""
    for name in ("STALLSCOPE_RANK", "RANK"):
        text = os.environ.get(name, "").strip()
        if text.isdigit():
            return int(text)
    return None


HANG_THRESHOLD_ENV = "STALLSCOPE_RUN_HANG_THRESHOLD_MS"


def _hang_threshold_ms():
    """This run's hang threshold from the environment (ms), None when unset or
    not a number (the daemon's threshold applies; it bounds the value)."""
    text = os.environ.get(HANG_THRESHOLD_ENV)
    try:
        return float(text) if text else None
    except ValueError:
        return None
