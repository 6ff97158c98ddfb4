"""The in-process probe: GC and span markers written to a preallocated buffer.

This module runs inside other people's serving processes, so it must never
cause what it measures. The hot path (`end()`, the wrappers that `attach()`
installs, the GC callback) allocates no GC-tracked object that outlives the
call, creates no reference cycle, retains nothing, never blocks on I/O and
never raises into the caller. Records go into one preallocated bytearray and
leave in one non-blocking send per flush; a full socket or an absent daemon
is a counted drop (and a gap in the sequence numbers), never a wait. GC
records are written by the GC callback into a separate single-producer ring
so the callback never takes the buffer lock (a collection can start while a
thread holds it). Standard library only.
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

from . import _wrap, wire

DEFAULT_SOCKET = "/run/stallscope/probe.sock"
SOCKET_ENV = "STALLSCOPE_SOCKET"

RECONNECT_INTERVAL_NS = 1_000_000_000  # at most one connection attempt a second
FLUSH_INTERVAL_NS = 20_000_000  # an outermost span end sends if older than this
IDLE_FLUSH_S = 0.1  # the background flusher's period
GC_RING_SLOTS = 256

_monotonic_ns = time.monotonic_ns
_native_id = threading.get_native_id
_pack_record = wire.RECORD.pack_into
_pack_header = wire.HEADER.pack_into
_REC_SPAN = wire.REC_SPAN
_REC_GC = wire.REC_GC
_HDR = wire.HEADER_SIZE
_RS = wire.RECORD_SIZE
_U32 = wire.U32_MAX
_FULL_AT = wire.DATAGRAM_MAX
_MOSTLY_FULL_AT = wire.HEADER_SIZE + (wire.MAX_RECORDS * 3 // 4) * wire.RECORD_SIZE

_live_probes = weakref.WeakSet()

# Numbers and functions the generated wrappers are compiled with.
_CONSTS = {
    "full": _FULL_AT,
    "rtype": _REC_SPAN,
    "rs": _RS,
    "interval": FLUSH_INTERVAL_NS,
    "half": _MOSTLY_FULL_AT,
    "pack": _pack_record,
    "mono": _monotonic_ns,
}


def _free_threaded():
    return (
        bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
        and not getattr(sys, "_is_gil_enabled", lambda: True)()
    )


class _ThreadState:
    """Per-thread probe state; one per thread, made on the thread's first span."""

    __slots__ = ("tid", "depth", "stage_id", "batch", "ext", "work", "idle")

    def __init__(self):
        self.tid = _native_id()
        self.depth = 0
        self.stage_id = 0
        self.batch = 0
        self.ext = 0  # 1: work or idle is set (the span gets an extension record)
        self.work = None
        self.idle = None


class Probe:
    """One run of one process, as seen by the daemon. Create with `connect()`."""

    def __init__(self, socket_path=None, run_label=None, gc=True):
        self.socket_path = socket_path or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET
        self.run_label = run_label or ""
        self._want_gc = bool(gc)
        self._lock = threading.Lock()
        self._buf = bytearray(wire.DATAGRAM_MAX)
        # One memoryview per possible datagram length, made once, so that a
        # send never creates a (GC-tracked) memoryview.
        whole = memoryview(self._buf)
        self._views = tuple(whole[: _HDR + n * _RS] for n in range(wire.MAX_RECORDS + 1))
        self._gc_buf = bytearray(GC_RING_SLOTS * _RS)
        self._ids = {}  # name (or enum) -> string id; kinds and stages
        self._names = []  # string id - 1 -> encoded name
        self._attached = []  # (owner, name, had_own, previous) for detach
        self._closed = False
        self.errors = 0  # exceptions swallowed on the hot path
        self._reset_run_state()
        self._sock = None
        self._fd = -1
        self._write = None
        self._next_connect_ns = 0
        self._local = threading.local()
        if self._want_gc:
            _gc.callbacks.append(self._on_gc)
        _live_probes.add(self)
        self._try_connect(_monotonic_ns())
        self._start_flusher()

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

    # ----- public API -------------------------------------------------------
    def begin(self):
        """Start of a span: CLOCK_MONOTONIC nanoseconds, to pass to `end()`."""
        return _monotonic_ns()

    def end(self, kind, t0, stage=None, batch=None):
        """Record the span `kind` from `t0` to now; never raises.

        Outside any attached method or `span()` block this is an outermost
        span end: the buffer is sent if it is older than 20 ms or 3/4 full."""
        try:
            t1 = _monotonic_ns()
            try:
                st = self._local.st
            except AttributeError:
                st = self._thread_state()
            kid = self._ids.get(kind)
            if kid is None:
                kid = self._intern(kind)
            sid = st.stage_id if stage is None else self._sid(stage)
            if batch is None:
                batch = st.batch
            self._lock.acquire()
            try:
                pos = self._pos
                if pos >= _FULL_AT:
                    self._send_full_locked(t1)
                    pos = self._pos
                _pack_record(
                    self._buf, pos, _REC_SPAN, st.depth, kid, st.tid, t0, t1, sid, batch & _U32
                )
                self._pos = pos + _RS
            finally:
                self._lock.release()
            if st.depth == 0:
                st.stage_id = 0
                st.batch = 0
                if t1 - self._last_send_ns >= FLUSH_INTERVAL_NS or self._pos >= _MOSTLY_FULL_AT:
                    self._flush(t1)
        except Exception:
            self.errors += 1

    def span(self, kind, stage=None, batch=None):
        """Context manager around a block: `with probe.span("prefill", batch=3):`."""
        return _Span(self, kind, stage, batch)

    def attach(self, target, path, kind, stage=None, batch=None):
        """Wrap the method `path` (dotted, relative to `target`) in place.

        `target` may be an instance (only that object's calls are timed) or a
        class (every instance's calls are timed: use this for per-call objects
        such as submission tickets; never wrap each instance, which is how
        the seed's hook made one reference cycle per submission). The
        wrapper takes the method's own parameters (names, kinds, default
        objects) and accepts, returns and raises exactly what the method
        does; static and class methods, `functools.lru_cache` and
        `partialmethod`, builtins and `async def` (the span covers the
        awaited call) are supported. Generators, properties and descriptors
        whose binding cannot be reproduced are refused with `AttachError`.
        `stage` and `batch` optionally say where the step's stage and batch
        size come from, as expressions of the language in `_expr.py`
        (`result.phase`, `len(arg0.requests)`, ...), compiled now into
        plain reads. Values found become the thread's current stage and
        batch, carried by every span that ends on the thread until the
        outermost span ends. Raises on a bad path or expression (set-up
        time), never on the hot path.
        """
        owner = target
        parts = path.split(".")
        for part in parts[:-1]:
            owner = getattr(owner, part)
        name = parts[-1]
        if isinstance(owner, type):
            plan = _wrap.plan_class(owner, name)
        else:
            plan = _wrap.plan_instance(owner, name, path)
        exprs = {"stage": stage, "batch": batch}
        wrapper = _wrap.build(self, plan, self._intern(kind), exprs, _CONSTS)
        wrapper.__stallscope_kind__ = kind
        if plan.store == "static":
            installed = staticmethod(wrapper)
        elif plan.store == "classmethod":
            installed = classmethod(wrapper)
        else:
            installed = wrapper
        owner_dict = getattr(owner, "__dict__", {})
        had_own = name in owner_dict
        previous = owner_dict.get(name) if had_own else None
        setattr(owner, name, installed)
        # An instance is remembered weakly (for detach at close), so that
        # attaching to one never keeps it alive.
        try:
            keep = owner if isinstance(owner, type) else weakref.ref(owner)
        except TypeError:
            keep = owner
        self._attached.append((keep, name, had_own, previous))
        return wrapper

    def flush(self):
        """Send what is buffered now (normally done for you)."""
        try:
            self._flush(_monotonic_ns())
        except Exception:
            self.errors += 1

    def close(self):
        """Flush, say goodbye, detach every wrapper and the GC callback."""
        if self._closed:
            return
        self._closed = True
        for owner, name, had_own, previous in reversed(self._attached):
            if isinstance(owner, weakref.ref):
                owner = owner()
                if owner is None:
                    continue
            try:
                if had_own:
                    setattr(owner, name, previous)
                else:
                    delattr(owner, name)
            except Exception:
                pass
        self._attached.clear()
        try:
            _gc.callbacks.remove(self._on_gc)
        except ValueError:
            pass
        with self._lock:
            self._drain_gc_locked()
            self._send_locked(_monotonic_ns())
            if self._sock is not None:
                try:
                    self._sock.send(
                        self._header(wire.DGRAM_BYE, 0, _monotonic_ns()),
                        socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL,
                    )
                except OSError:
                    pass
                self._disconnect()
        _live_probes.discard(self)

    @property
    def connected(self):
        return self._sock is not None

    def stats(self):
        """Counters, for tests and the curious (a fresh dict: not hot path)."""
        return {
            "sent_records": self.sent_records,
            "drops_full": self.drops_full,
            "drops_disconnected": self.drops_disconnected,
            "errors": self.errors,
            "next_seq": self._seq + (self._pos - _HDR) // _RS,
            "connected": self.connected,
            "run_token": self.run_token,
        }

    # ----- hot path internals ----------------------------------------------
    def _thread_state(self):
        st = _ThreadState()
        self._local.st = st
        return st

    def _sid(self, stage):
        sid = self._ids.get(stage)
        if sid is None:
            sid = self._stage_id(stage)
        return sid

    def _flush(self, now):
        self._lock.acquire()
        try:
            self._drain_gc_locked()
            self._send_locked(now)
        finally:
            self._lock.release()

    def _send_full_locked(self, now):
        self._drain_gc_locked()
        if self._pos >= _FULL_AT:
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
            if self._pos >= _FULL_AT:
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

    def _on_gc(self, phase, info):
        try:
            if phase == "start":
                self._gc_t0 = _monotonic_ns()
                return
            t1 = _monotonic_ns()
            w = self._gc_w
            if w - self._gc_r >= GC_RING_SLOTS:
                self._gc_lost += 1
                return
            _pack_record(
                self._gc_buf,
                (w % GC_RING_SLOTS) * _RS,
                _REC_GC,
                info["generation"],
                0,
                _native_id(),
                self._gc_t0,
                t1,
                min(info["collected"], _U32),
                min(info["uncollectable"], _U32),
            )
            self._gc_w = w + 1
        except Exception:
            self.errors += 1

    # ----- cold path: strings, connection ------------------------------------
    def _intern(self, name):
        sid = self._ids.get(name)
        if sid is not None:
            return sid
        with self._lock:
            sid = self._ids.get(name)
            if sid is None:
                if len(self._names) >= 0xFFFF:
                    return 0
                text = name if isinstance(name, str) else str(name)
                self._names.append(text.encode("utf-8", "replace")[: wire.STRING_MAX_BYTES])
                sid = len(self._names)  # ids start at 1; 0 means "none"
                self._ids[name] = sid
        return sid

    def _stage_id(self, stage):
        if isinstance(stage, str):
            return self._intern(stage)
        name = getattr(stage, "name", None)  # enums: intern the member's name
        sid = self._intern(name if isinstance(name, str) else str(stage))
        try:
            self._ids[stage] = sid  # later lookups by the object itself hit
        except TypeError:
            pass
        return sid

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

    # ----- background flush and fork ----------------------------------------
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


class _Span:
    __slots__ = ("probe", "kind", "stage", "batch", "t0")

    def __init__(self, probe, kind, stage, batch):
        self.probe = probe
        self.kind = kind
        self.stage = stage
        self.batch = batch

    def __enter__(self):
        probe = self.probe
        try:
            st = probe._local.st
        except AttributeError:
            st = probe._thread_state()
        st.depth += 1
        self.t0 = _monotonic_ns()
        return self

    def __exit__(self, *exc):
        self.probe._local.st.depth -= 1
        self.probe.end(self.kind, self.t0, self.stage, self.batch)
        return False


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
