"""The shared life of the kernel-cause probes (page faults, IRQ time, syscalls).

Each such probe is one bcc program (`source`, with its layout header) whose
tracepoints filter in the kernel on a `tracked` tgid map, write records to
one ring buffer (`events`) and count losses in a `struct counters`. This
class compiles it, takes the record dtype from the compiled program, reads
the ring in batches on a timer that stretches while the ring is quiet
(`bpf_common.Cadence`), hands batches to `_emit`, turns counter
increases into `losses` rows, and keeps `tracked` in step with track() and
untrack(). A probe whose program aggregates in a hash map (`aggs`) gets its
idle entries swept here too. A probe may be detachable (`attached`): its
program stays loaded and its tracepoints are attached only while it covers.
It never calls Python per event and never reads a task_struct field.
"""

import ctypes as ct
import logging
import threading
import time

from stallscope import threads
from stallscope.probes import bpf_common
from stallscope.probes.base import Probe, ReaderPark
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

SYS_BPF = 321  # x86-64
BPF_MAP_LOOKUP_AND_DELETE_ELEM = 21


class _MapElemAttr(ct.Structure):
    _fields_ = [
        ("map_fd", ct.c_uint32),
        ("pad", ct.c_uint32),
        ("key", ct.c_uint64),
        ("value", ct.c_uint64),
        ("flags", ct.c_uint64),
    ]


_libc = ct.CDLL(None, use_errno=True)


def lookup_and_delete(table, key):
    """The value of `key`, removed from hash map `table` in one step (so an
    update by the kernel cannot fall between our read and our delete); None
    when the key is gone."""
    leaf = table.Leaf()
    attr = _MapElemAttr(
        map_fd=table.map_fd,
        key=ct.addressof(key),
        value=ct.addressof(leaf),
    )
    if _libc.syscall(SYS_BPF, BPF_MAP_LOOKUP_AND_DELETE_ELEM, ct.byref(attr), ct.sizeof(attr)):
        return None
    return leaf


class BccTracepointProbe(Probe):
    backend = "bcc"
    source = ""  # the .c file in this folder
    tracepoints = ()  # ("category:event", ...) the program attaches
    record_fields = ()  # fields of `struct record` the reader uses
    loss_reasons = {}  # counters field -> loss reason (with the fix)
    detachable = False  # attached only while covering (expensive probes)

    @classmethod
    def unavailable(cls, settings=None):
        return bpf_common.bcc_unavailable(cls.tracepoints)

    def __init__(self, settings=None):
        super().__init__(settings)
        self.ring_pages = int(self.settings.kernel_ring_pages)
        self.poll_s = self.settings.kernel_poll_ms / 1000.0
        self.max_tgids = int(self.settings.sched_max_tgids)
        self._bpf = None
        self._ring = None
        self._counters = None
        self._sink = None
        self._lock = threading.Lock()  # one drainer at a time
        self._stop = threading.Event()
        self._park = ReaderPark()  # the reader sleeps while nothing is tracked
        self._thread = None
        self._tracked = set()
        self._attached = False
        self.records = 0
        self.rows = 0
        self._lost_seen = {}
        self._lost_since_ns = time.monotonic_ns()
        self._reader_cpu_ns = 0

    # -- hooks for subclasses --------------------------------------------------

    def cflags(self):
        return []

    def _emit(self, recs):
        """Write a batch of ring records (numpy structured array) to the sink."""
        raise NotImplementedError

    def _sweep(self, now_ns, final=False):
        """Periodic work besides the ring (e.g. flushing idle aggregates)."""

    def _started(self):
        """Called once the program is loaded and the reader runs."""

    # -- lifecycle -------------------------------------------------------------

    def start(self, sink):
        if self._bpf is not None:
            return
        pages = self.ring_pages
        if pages & (pages - 1):
            raise ValueError(f"kernel_ring_pages must be a power of two, not {pages}")
        flags = [f"-DRINGBUF_PAGES={pages}", f"-DMAX_TGIDS={self.max_tgids}", *self.cflags()]
        self._bpf = bpf_common.compile_program(self.source, flags)
        try:
            record = bpf_common.map_value_dtype(self._bpf, "layout_record")
            header = self.source.replace(".c", ".h")
            bpf_common.require_fields(record, self.record_fields, f"{header} struct record")
            self._ring = bpf_common.RingReader(
                self._bpf, "events", bpf_common.ring_record_dtype(record), pages
            )
            self._counters = bpf_common.Counters(self._bpf)
            bpf_common.require_fields(
                self._counters.dtype, list(self.loss_reasons), f"{header} struct counters"
            )
        except Exception:
            self._bpf.cleanup()
            self._bpf = None
            raise
        self._lost_seen = dict.fromkeys(self.loss_reasons, 0)
        self._sink = sink
        self._attached = True  # bcc attaches every TRACEPOINT_PROBE on load
        if self.detachable:
            self.detach()
        self._lost_since_ns = time.monotonic_ns()
        for pid in list(self._tracked):
            self._load_tracked(pid)
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._reader, name=f"stallscope-{self.name}-bcc", daemon=True
        )
        self._thread.start()
        self._started()
        log.info("%s probe: bcc program %s loaded", self.name, self.source)

    def stop(self):
        if self._bpf is None:
            return
        self._stop.set()
        self._park.wake()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.drain(final=True)
        with self._lock:
            self._ring.close()
            self._counters.close()
            self._ring = None
        self._bpf.cleanup()
        self._bpf = None
        self._attached = False

    # -- attaching (detachable probes) -------------------------------------------

    def attach(self):
        """Attach every tracepoint of the loaded program (idempotent)."""
        if self._bpf is None or self._attached:
            return
        for tp in self.tracepoints:
            category, _, event = tp.partition(":")
            self._bpf.attach_tracepoint(
                tp=tp.encode(), fn_name=f"tracepoint__{category}__{event}".encode()
            )
        self._attached = True

    def detach(self):
        """Detach every tracepoint; what was counted so far is flushed."""
        if self._bpf is None or not self._attached:
            return
        for tp in self.tracepoints:
            try:
                self._bpf.detach_tracepoint(tp=tp.encode())
            except Exception as exc:  # already gone: nothing to stop
                log.debug("%s probe: detach %s: %s", self.name, tp, exc)
        self._attached = False
        self.drain(final=True)

    @property
    def attached(self):
        return self._attached

    def covering(self):
        return self._bpf is not None and self._attached

    # -- who is followed -------------------------------------------------------

    def track(self, pid):
        pid = int(pid)
        self._tracked.add(pid)
        self._park.followed(len(self._tracked))
        if self._bpf is not None:
            self._load_tracked(pid)

    def _load_tracked(self, pid):
        self._bpf[b"tracked"][ct.c_uint32(pid)] = ct.c_uint8(1)

    def untrack(self, pid):
        pid = int(pid)
        self._tracked.discard(pid)
        self._park.followed(len(self._tracked))
        self._park.hurry()  # its last records now, not after a wait of up to 1 s
        if self._bpf is None:
            return
        try:
            del self._bpf[b"tracked"][ct.c_uint32(pid)]
        except KeyError:
            pass

    # -- reading -----------------------------------------------------------------

    def _reader(self):
        ring = self._ring
        # A ring more than half full raises the reader to normal priority
        # until it is drained (the reader itself, threads.keep_up, or the main
        # loop, threads.check_backlogs; the main loop lowers it again).
        threads.background(f"{self.name}-reader", backlog=ring.fill, hurry=self._park.hurry)
        t_cpu = time.thread_time_ns()
        cadence = bpf_common.Cadence(self.poll_s)
        wait_s = self.poll_s
        while not self._park.wait(self._stop, wait_s):
            try:
                threads.keep_up()
                # A detached probe's ring stays empty: read it rarely.
                wait_s = cadence.next(self.drain())
            except Exception:  # a failing sink must not kill the reader
                log.exception("%s probe: reader error", self.name)
            now_cpu = time.thread_time_ns()
            self._reader_cpu_ns += now_cpu - t_cpu
            t_cpu = now_cpu

    def drain(self, final=False):
        """Hand everything committed so far to the sink; returns records read."""
        with self._lock:
            if self._ring is None:
                return 0
            recs = self._ring.read()
            if len(recs):
                self.records += len(recs)
                self._emit(recs)
            self._sweep(time.monotonic_ns(), final)
            self._check_losses()
            return len(recs)

    def _check_losses(self):
        now = time.monotonic_ns()
        counts = self._counters.read()
        for key, reason in self.loss_reasons.items():
            delta = counts[key] - self._lost_seen[key]
            if delta > 0:
                self._sink.loss(self.name, self._lost_since_ns, now, int(delta), reason)
                self._lost_seen[key] = counts[key]
        self._lost_since_ns = now

    def _append(self, table, columns):
        n = len(next(iter(columns.values())))
        if n:
            self._sink.append(table, columns)
            self.rows += n

    # -- aggregates ------------------------------------------------------------------

    def sweep_aggregates(self, map_name, idle_ns, now_ns, final):
        """(key, value) of every entry of hash map `map_name` idle for
        `idle_ns` (all of them if `final`), each removed from the map in one
        step. The kernel closes busy entries itself; this flushes the tails."""
        table = self._bpf[map_name.encode()]
        out = []
        for key, value in table.items_lookup_batch():
            if final or now_ns - value.last_ns >= idle_ns:
                if not isinstance(key, ct.Structure | ct._SimpleCData):
                    key = table.Key(key)  # scalar keys come back as ints
                got = lookup_and_delete(table, key)
                if got is not None:
                    out.append((key, got))
        return out

    def status(self):
        return {
            "backend": self.backend,
            "attached": self._attached,
            "tracked": sorted(self._tracked),
            "records": self.records,
            "rows": self.rows,
            "lost": dict(self._lost_seen),
            "reader_cpu_ns": self._reader_cpu_ns,
            "poll_ms": self.poll_s * 1000,
        }
