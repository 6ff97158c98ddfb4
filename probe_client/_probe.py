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
thread holds it). This module holds the public API, the hot-path record
writes and the GC callback; `_transport.py` the buffer and the socket,
`_wrap.py`/`_codegen.py` the wrappers of `attach()`, `_requests.py` the
request lifecycle events. Standard library only:
the C record write of `_accel.c` is used when it was built and imports, and
the Python path here stays the definition of every record (`accelerator`
says which one a probe uses).
"""

import gc as _gc
import os
import threading
import weakref

from . import _codegen, _wrap, wire
from ._connection import _free_threaded
from ._gcknobs import GcForensics
from ._requests import RequestEvents
from ._transport import (
    FLUSH_INTERVAL_NS,
    FULL_AT,
    MOSTLY_FULL_AT,
    Transport,
    _live_probes,
    _monotonic_ns,
    _native_id,
)

try:  # built at install when a compiler was there; never required
    from . import _accel
except ImportError:
    _accel = None

DEFAULT_SOCKET = "/run/stallscope/probe.sock"
SOCKET_ENV = "STALLSCOPE_SOCKET"
# "python" (or 0, off, no) keeps a new probe on the Python record write even
# where the C one is built: for comparisons, and as a way out of a bad build.
ACCEL_ENV = "STALLSCOPE_PROBE_ACCEL"

_pack_record = wire.RECORD.pack_into
_REC_SPAN = wire.REC_SPAN
_REC_GC = wire.REC_GC
_HDR = wire.HEADER_SIZE
_RS = wire.RECORD_SIZE
_U32 = wire.U32_MAX
_I64 = 1 << 63

# Numbers and functions the generated wrappers are compiled with.
# The kind of a request-only attach: the call records its request events, no span.
REQUEST_KIND = "request"

_CONSTS = {
    "full": FULL_AT,
    "rtype": _REC_SPAN,
    "rs": _RS,
    "interval": FLUSH_INTERVAL_NS,
    "half": MOSTLY_FULL_AT,
    "pack": _pack_record,
    "mono": _monotonic_ns,
}


def _accel_for_new_probe():
    """The C module if it is built, wanted, and safe in this interpreter."""
    if _accel is None or _free_threaded():
        # The C write relies on the GIL to be atomic: never without it.
        return None
    if os.environ.get(ACCEL_ENV, "").strip().lower() in ("0", "off", "no", "python"):
        return None
    return _accel


# What a probe made now with the default environment uses: "c" or "python".
ACCELERATOR = "c" if _accel is not None and not _free_threaded() else "python"


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


class Probe(Transport, GcForensics, RequestEvents):
    """One run of one process, as seen by the daemon. Create with `connect()`."""

    def __init__(
        self,
        socket_path=None,
        run_label=None,
        gc=True,
        close_wait_ms=None,
        census=None,
        census_after_s=None,
        census_top=None,
        gc_freeze_after_s=None,
        gc_threshold=None,
        pythreads=None,
    ):
        self.socket_path = socket_path or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET
        self.run_label = run_label or ""
        self._want_gc = bool(gc)
        self._accel = _accel_for_new_probe()
        # Which record write this probe's wrappers use; also sent in HELLO.
        self.accelerator = "c" if self._accel is not None else "python"
        self._init_buffers(close_wait_ms)
        self._init_pythreads(pythreads)
        self._ids = {}  # name (or enum) -> string id; kinds and stages
        self._names = []  # string id - 1 -> encoded name
        self._attached = []  # (owner, name, had_own, previous) for detach
        self._closed = False
        self.errors = 0  # exceptions swallowed on the hot path
        self._init_requests()
        self._reset_run_state()
        self._local = threading.local()
        # Census and knobs (_gcknobs.py) before the HELLO, which records them.
        self._init_gc_forensics(census, census_after_s, census_top, gc_freeze_after_s, gc_threshold)
        if self._want_gc:
            _gc.callbacks.append(self._on_gc)
        _live_probes.add(self)
        self._try_connect(_monotonic_ns())
        self._start_flusher()

    # ----- public API -------------------------------------------------------
    def begin(self):
        """Start of a span: CLOCK_MONOTONIC nanoseconds, to pass to `end()`."""
        return _monotonic_ns()

    def end(self, kind, t0, stage=None, batch=None, work=None, idle=None):
        """Record the span `kind` from `t0` to now; never raises.

        `stage`, `batch`, `work` (an integer work measure) and `idle` (a
        bool) label this span; left out, stage and batch are the thread's
        current ones (set by attached methods), and work and idle too.
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
            if work is None:
                work = st.work
            else:
                work = int(work)
                if not -_I64 <= work < _I64:
                    work = None
            if idle is None:
                idle = st.idle
            else:
                idle = bool(idle)
            self._lock.acquire()
            try:
                pos = self._pos
                if pos >= FULL_AT:
                    self._send_full_locked(t1)
                    pos = self._pos
                _pack_record(
                    self._buf, pos, _REC_SPAN, st.depth, kid, st.tid, t0, t1, sid, batch & _U32
                )
                if work is None and idle is None:
                    self._pos = pos + _RS
                else:
                    self._put_ext_locked(pos + _RS, work, idle)
            finally:
                self._lock.release()
            if st.depth == 0:
                st.stage_id = 0
                st.batch = 0
                if st.ext:
                    st.ext = 0
                    st.work = None
                    st.idle = None
                if t1 - self._last_send_ns >= FLUSH_INTERVAL_NS or self._pos >= MOSTLY_FULL_AT:
                    self._flush(t1)
        except Exception:
            self.errors += 1

    def span(self, kind, stage=None, batch=None, work=None, idle=None):
        """Context manager around a block: `with probe.span("prefill", batch=3):`."""
        return _Span(self, kind, stage, batch, work, idle)

    def attach(
        self,
        target,
        path,
        kind,
        stage=None,
        batch=None,
        work=None,
        idle=None,
        request=None,
        request_id=None,
        request_tokens=None,
        request_then=None,
    ):
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
        outermost span ends. `request` (an EVENT expression: "'arrived'",
        '"finished" if result else None') with `request_id` (and optionally
        `request_tokens`, and `request_then`: a second event of the same
        request) records `probe.request()` after each call that returned;
        with kind "request" the call records those events and no span.
        Raises on a bad path or expression (set-up time), never on the hot
        path.
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
        exprs = {"stage": stage, "batch": batch, "work": work, "idle": idle, "request": request,
                 "request_id": request_id, "request_tokens": request_tokens,
                 "request_then": request_then}  # fmt: skip
        request_only = kind == REQUEST_KIND
        kid = 0 if request_only else self._intern(kind)
        wrapper = _codegen.build(self, plan, kid, exprs, _CONSTS, request_only=request_only)
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
        """Flush, say goodbye, detach every wrapper and the GC callback.

        Waits at most `close_wait_ms` (default 300 ms, $STALLSCOPE_CLOSE_WAIT_MS,
        0: no wait) for socket space so the last records and the BYE land."""
        if self._closed:
            return
        self._close_census()  # while the engine's objects still exist; queued before BYE
        self._closed = True
        try:
            _gc.callbacks.remove(self._on_gc)  # first: nothing after close is recorded
        except ValueError:
            pass
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
            self._close_transport()
        finally:
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
            "connect_busy": self.connect_busy,
            "errors": self.errors,
            "request_errors": self.request_errors,
            "drops_gc_ring": self.drops_gc_ring,
            "next_seq": self._seq + ((self._pos - _HDR) >> 5) - self._seqless,
            "connected": self.connected,
            "run_token": self.run_token,
            "pythreads_sent": self.pythreads_sent,
            "pythreads_errors": self.pythreads_errors,
            "pythreads_status": self._pyreporter.intro.status if self._pyreporter else None,
        }

    # ----- hot path internals ----------------------------------------------
    def _thread_state(self):
        st = _ThreadState() if self._accel is None else self._accel.ThreadState(_native_id())
        self._local.st = st
        return st

    def _write_declined(self, local, kid, t0):
        """A C leave() that declined: the span it timed, by the Python path.
        `local` is the wrapper's own (after a fork `self._local` is new)."""
        st = local.st
        self._write_span(st, kid, t0, st.last_end_ns)

    def _write_span(self, st, kid, t0, t1):
        """A wrapper's record write and outermost bookkeeping, Python path:
        what `_codegen._WRITE_PY` inlines, for a C write that declined."""
        self._lock.acquire()
        try:
            pos = self._pos
            if pos >= FULL_AT:
                self._send_full_locked(t1)
                pos = self._pos
            _pack_record(
                self._buf, pos, _REC_SPAN, st.depth, kid, st.tid, t0, t1, st.stage_id, st.batch
            )
            if st.ext:
                self._put_ext_locked(pos + _RS, st.work, st.idle)
            else:
                self._pos = pos + _RS
        finally:
            self._lock.release()
        if st.depth == 0:
            st.stage_id = 0
            st.batch = 0
            if st.ext:
                st.ext = 0
                st.work = None
                st.idle = None
            if t1 - self._last_send_ns >= FLUSH_INTERVAL_NS or self._pos >= MOSTLY_FULL_AT:
                self._flush(t1)

    def _sid(self, stage):
        sid = self._ids.get(stage)
        if sid is None:
            sid = self._stage_id(stage)
        return sid

    def _on_gc(self, phase, info):
        try:
            if phase == "start":
                self._gc_t0 = _monotonic_ns()
                return
            t1 = _monotonic_ns()
            w = self._gc_w
            if w - self._gc_r >= self._gc_slots:
                if self._lock.acquire(False):  # never waits: a thread may hold it
                    try:
                        self._drain_gc_locked(send=False)
                    finally:
                        self._lock.release()
                if w - self._gc_r >= self._gc_slots:
                    self._gc_lost += 1
                    return
            _pack_record(
                self._gc_buf,
                (w % self._gc_slots) * _RS,
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
            if w + 1 - self._gc_r >= self._gc_half and self._lock.acquire(False):
                # A burst with no flush in sight (a big heap built between
                # steps): move the ring into the buffer now, on this
                # callback's own schedule; never waits for the lock, never sends.
                try:
                    self._drain_gc_locked(send=False)
                finally:
                    self._lock.release()
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


class _Span:
    __slots__ = ("probe", "kind", "stage", "batch", "work", "idle", "t0")

    def __init__(self, probe, kind, stage, batch, work, idle):
        self.probe = probe
        self.kind = kind
        self.stage = stage
        self.batch = batch
        self.work = work
        self.idle = idle

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
        self.probe.end(self.kind, self.t0, self.stage, self.batch, self.work, self.idle)
        return False
