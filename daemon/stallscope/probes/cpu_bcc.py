"""CPU sampler (bcc): timestamped stacks of tracked threads on CPU, Python frames included.

Loads `cpu_bcc.c` (settings as cflags: cpu_max_depth, ring size) and, while
at least one process is tracked, attaches it with bcc `attach_perf_event`
to one software cpu-clock event per CPU at `cpu_sample_hz` (this VM has no
PMU; cpu-clock ticks only on busy CPUs); or, with `cpu_sample_clock =
"tick"`, to the `timer:hrtimer_expire_entry` tracepoint, keeping the
scheduler's own tick (kernel_tick.py: CONFIG_HZ, no interrupt of ours,
which costs a torch thread ~100 us each on a VM); with "auto", the
default, the tick where the timer measured at start costs a busy thread
more than 2 % of its CPU (timer_cost.py), else the timer. The program filters on the tracked
tgids in the kernel, unwinds CPython 3.10-3.13 frames there and writes one
record per sample (time, thread, CPU, kernel mode, native leaf IP, Python
frames as code address + instruction + checksum) and, once per code object
and checksum, a record naming it. Hooks: perf events only (no tracepoint,
kprobe or fentry; the tick clock adds one tracepoint); needs CAP_BPF +
CAP_PERFMON (or root), x86-64.

Which thread state is whose comes from the traced process itself: its
probe client reports its interpreter's layout (checked against the live
interpreter there) and its thread states over its own connection
(probe_client/_pythreads.py); ingest keeps only threads of the peer's own
pid (SO_PEERCRED); `accept_layout` checks every offset against the
program's object heads before one byte of it reaches the kernel. A process
without an accepted layout (no report yet, an interpreter the table lacks,
a refused report) is sampled with its native leaf only. No task_struct field
is read anywhere.

One reader thread (`threads.background("cpu-sampler")`, raised to normal
priority while its ring is more than half full) drains both rings
through mmap in batches (`bpf_common.RingReader`), samples first, then
symbols (the program commits a sample's symbols before the sample), and
turns them into `cpu_samples` / `cpu_stacks` / `cpu_frames` rows
(cpu_stacks.py: work per distinct stack, native leaves symbolized now, while
the process is alive). Ring losses come from the program's counters, the
unwinder's failures by reason from the samples themselves; both go to
`losses`. It never calls Python per sample in the kernel path and never
blocks a producer.
"""

import collections
import ctypes as ct
import logging
import os
import threading
import time

import numpy as np

from probe_client import pyoffsets
from stallscope import threads as daemon_threads
from stallscope.probes import bpf_common, kernel_tick, perf_events, timer_cost
from stallscope.probes.base import Probe, periodic_wait
from stallscope.probes.cpu_stacks import StackTable

log = logging.getLogger(__name__)

SOURCE = "cpu_bcc.c"
TICK_FN = b"tracepoint__timer__hrtimer_expire_entry"  # bcc's name of the tick-clocked program
MAX_DEPTH_LIMIT = 192  # the verifier's 1M-instruction budget: ~284k at 64, ~530k at 128
HEADS = bpf_common.header_defines("cpu_bcc.h", "")
_HEAD_OF = {"ts_read": "TSTATE_HEAD", "frame_read": "FRAME_HEAD", "code_read": "CODE_HEAD"}
_HEAD_OF["str_read"] = "STR_HEAD"
SAMPLE_FIELDS = ("ts_ns", "user_ip", "pid", "tid", "cpu", "kernel_mode", "status", "depth",
                 "flags", "frames")  # fmt: skip
SYMBOL_FIELDS = ("code", "cksum", "pid", "firstlineno", "name_len", "file_len", "linetable_len",
                 "name_copied", "file_copied", "linetable_copied", "name_enc", "file_enc",
                 "name", "file", "linetable")  # fmt: skip
RING_LOSSES = {
    "reserve_failed": "CPU sample ring full: samples dropped (raise cpu_ring_pages "
    "or lower cpu_poll_ms)",
    "sym_reserve_failed": "CPU symbol ring full: a code object was named at a later "
    "sample, frames '<unknown>' meanwhile (raise cpu_ring_pages)",
}
# cpu_samples.unwind -> the loss it is (the samples are kept, their Python frames are not)
UNWIND_LOSSES = {
    "no_tstate": "CPU sampler: thread without a reported thread state (just started, or "
    "its client sends no report): native leaf only",
    "tstate_fault": "CPU sampler: thread state unreadable (the thread was ending): "
    "native leaf only",
    "no_python": "CPU sampler: no usable Python layout for the process (not reported, "
    "or refused: see probe_status): native leaf only",
    "frame_fault": "CPU sampler: a frame or code object was unreadable: outer frames lost",
    "truncated": "CPU sampler: stack deeper than cpu_max_depth: outermost frames cut "
    "(raise cpu_max_depth)",
}
UNWIND_LOSS_INTERVAL_NS = 1_000_000_000  # unwinder losses are rows of at most this
SWEEP_INTERVAL_S = 10.0  # tstates entries of threads that are gone are dropped this often
# Samples resolved between two looks at the ring's fill while a backlog is
# drained (threads.keep_up): at idle priority on full CPUs one drain of a
# whole ring took seconds, and the reader raised itself only after it, at
# 78-87 % (a steady drain holds ~200 samples: one chunk).
DRAIN_CHUNK = 2048
IDLE_WAIT_S = 5.0  # the reader's longest sleep while nothing is tracked
# the layout fields copied into `struct pylayout` as they are (name there: key in the report)
_COPIED = {
    "ts_native_tid": "ts_native_thread_id",
    "ts_read": "ts_read",
    "f_code": "f_code",
    "f_back": "f_back",
    "f_instr": "f_instr",
    "f_owner": "f_owner",
    "frame_read": "frame_read",
    "co_argcount": "co_argcount",
    "co_flags": "co_flags",
    "co_firstlineno": "co_firstlineno",
    "co_filename": "co_filename",
    "co_linetable": "co_linetable",
    "co_firsttraceable": "co_firsttraceable",
    "code_read": "code_read",
    "ob_type": "ob_type",
    "str_length": "str_length",
    "str_state": "str_state",
    "str_ascii_data": "str_ascii_data",
    "str_compact_data": "str_compact_data",
    "str_utf8_length": "str_utf8_length",
    "str_utf8": "str_utf8",
    "str_read": "str_read",
    "bytes_size": "bytes_size",
    "bytes_data": "bytes_data",
}
USER_ADDR_MAX = 1 << 47


class Refused(Exception):
    """A layout report that must not reach the kernel; the message says why."""


def perf_unavailable():
    """None when a cpu-clock perf event opens here (one CPU, every process),
    else why not and how to fix it."""
    try:
        fd = perf_events.perf_event_open(perf_events.cpu_clock_attr(1_000_000), -1, 0)
    except OSError as exc:
        return (
            f"cannot open a cpu-clock perf event ({exc.strerror}): needs CAP_PERFMON "
            "(or root, or sysctl kernel.perf_event_paranoid=-1)"
        )
    os.close(fd)
    return None


class _Proc:
    """One tracked process: its layout state and its reported threads."""

    __slots__ = ("pid", "gen", "status", "version", "tids", "layout")

    def __init__(self, pid, gen):
        self.pid = pid
        self.gen = gen
        self.status = "no layout report yet: native leaves only"
        self.version = None
        self.tids = {}  # tid -> tstate (as reported)
        self.layout = None  # the accepted struct pylayout, or None


class BccCpuProbe(Probe):
    """Stacks of tracked threads on CPU, sampled by a per-CPU cpu-clock event."""

    name = "cpu"
    backend = "bcc"

    @classmethod
    def unavailable(cls, settings=None):
        why = bpf_common.bcc_unavailable((), tracefs=None)
        if why:
            return why
        if os.uname().machine != "x86_64":
            return f"the CPU sampler reads x86-64 registers and offsets, not {os.uname().machine}"
        clock = "timer" if settings is None else settings.cpu_sample_clock
        if clock == "tick":
            return kernel_tick.tick_info(settings.proc_root)[1]
        no_timer = perf_unavailable()
        if clock == "auto" and no_timer:
            no_tick = kernel_tick.tick_info(settings.proc_root)[1]
            return f"{no_timer}; {no_tick}" if no_tick else None
        return no_timer

    def __init__(self, settings=None):
        super().__init__(settings)
        s = self.settings
        self.hz = float(s.cpu_sample_hz)
        # "timer": a cpu-clock perf event at cpu_sample_hz; "tick": the
        # scheduler's tick (kernel_tick.py), at CONFIG_HZ, known at start();
        # "auto": one of the two, by the timer's cost measured at start()
        # (timer_cost.py)
        self.clock_setting = self.clock = s.cpu_sample_clock
        if self.clock not in ("auto", "timer", "tick"):
            raise ValueError(
                f"cpu_sample_clock must be 'auto', 'timer' or 'tick', not {self.clock!r}"
            )
        self.clock_why = None  # what "auto" measured and chose
        self.timer_cost = None  # its TimerCost, when it measured one
        self.tick = None
        self.max_depth = int(s.cpu_max_depth)
        if self.max_depth > MAX_DEPTH_LIMIT:
            log.warning(
                "cpu probe: cpu_max_depth %d is above %d (the verifier's limit): using %d",
                self.max_depth,
                MAX_DEPTH_LIMIT,
                MAX_DEPTH_LIMIT,
            )
            self.max_depth = MAX_DEPTH_LIMIT
        self.ring_pages = int(s.cpu_ring_pages)
        self.poll_s = s.cpu_poll_ms / 1000.0
        self.max_tgids = int(s.sched_max_tgids)
        self.max_tids = int(s.sched_max_tids)
        self.proc_root = s.proc_root
        self._bpf = None
        self._sink = None
        self._ring = self._sym_ring = self._counters = None
        # Who is sampled: `_procs`, the `tracked` and `tstates` maps, the perf
        # events. Held only for map updates, so the main loop's track(),
        # accept_layout() and untrack() never wait behind a drain.
        self._lock = threading.RLock()
        # The reader's own: the rings, the stack tables, the rows for the sink.
        # A drain runs at idle priority and can take seconds on a full host (a
        # module's symbols loaded); while it held the one lock, a client's
        # layout report waited for it in the main loop and the whole run was
        # sampled without Python frames, its ring never read (4 of 5 runs of a
        # traced spinner beside two CPU hogs).
        self._drain_lock = threading.RLock()
        self._departed = collections.deque()  # untracked pids, forgotten by the next drain
        self._stop = threading.Event()
        self._wake = threading.Event()  # set when something is tracked again
        self._hurry = threading.Event()  # ends the reader's wait: stop(), a filling ring
        self._thread = None
        self._procs = {}  # pid -> _Proc
        self._gen = 0
        self._attached = False
        self.stacks = StackTable()
        self.samples = 0
        self.symbols = 0
        self.drains = 0
        self.load_s = None
        self._lost_seen = dict.fromkeys(RING_LOSSES, 0)
        self._lost_since_ns = time.monotonic_ns()
        self._unwind = {}  # reason -> [count, first_ns, last_ns] not yet written
        self._unwind_since_ns = time.monotonic_ns()
        self._unwind_total = dict.fromkeys(UNWIND_LOSSES, 0)
        self._last_sweep = time.monotonic()
        self._reader_cpu_ns = 0
        self.refusals = {}  # pid -> why its Python frames are off

    # ----- lifecycle ---------------------------------------------------------------------
    def start(self, sink):
        if self._bpf is not None:
            return
        pages = self.ring_pages
        if pages & (pages - 1):
            raise ValueError(f"cpu_ring_pages must be a power of two, not {pages}")
        cflags = [
            f"-DMAX_DEPTH={self.max_depth}",
            f"-DSAMPLE_RING_PAGES={pages}",
            f"-DSYMBOL_RING_PAGES={max(64, pages // 4)}",
            f"-DMAX_TGIDS={self.max_tgids}",
            f"-DMAX_TIDS={self.max_tids}",
        ]
        tick_info = None
        if self.clock_setting == "auto":
            tick_info = kernel_tick.tick_info(self.proc_root)
            self.clock, self.clock_why = self._choose_clock(tick_info[1])
            log.info("cpu probe: %s", self.clock_why)
        if self.clock == "tick":
            self.tick, why = tick_info or kernel_tick.tick_info(self.proc_root)
            if why:
                raise RuntimeError(why)
            self.hz = float(self.tick.hz)
            cflags += self.tick.cflags()
        t0 = time.monotonic()
        self._bpf = bpf_common.compile_program(SOURCE, cflags)
        try:
            sample = bpf_common.map_value_dtype(self._bpf, "layout_sample")
            symbol = bpf_common.map_value_dtype(self._bpf, "layout_symbol")
            bpf_common.require_fields(sample, SAMPLE_FIELDS, "cpu_bcc.h struct sample")
            bpf_common.require_fields(symbol, SYMBOL_FIELDS, "cpu_bcc.h struct symbol")
            self._ring = bpf_common.RingReader(
                self._bpf, "samples", bpf_common.ring_record_dtype(sample), pages
            )
            self._sym_ring = bpf_common.RingReader(
                self._bpf, "symbols", bpf_common.ring_record_dtype(symbol), max(64, pages // 4)
            )
            self._counters = bpf_common.Counters(self._bpf)
            bpf_common.require_fields(
                self._counters.dtype, list(RING_LOSSES), "cpu_bcc.h struct counters"
            )
            if self.tick is None:
                self._bpf.load_func(b"on_sample", self._bpf.PERF_EVENT)
            else:  # bcc attached the tracepoint as it loaded: attached only while tracking
                self._bpf.detach_tracepoint(tp=kernel_tick.TRACEPOINT.encode())
        except Exception:
            self._bpf.cleanup()
            self._bpf = None
            raise
        self.load_s = time.monotonic() - t0
        self.record_bytes = self._ring.dtype.itemsize
        self._sink = sink
        self._lost_since_ns = self._unwind_since_ns = time.monotonic_ns()
        with self._lock:
            for proc in self._procs.values():
                self._write_layout(proc)
            self._attach_if_needed()
        self._stop.clear()
        self._thread = threading.Thread(target=self._reader, name="stallscope-cpu-bcc", daemon=True)
        self._thread.start()
        log.info(
            "cpu probe: bcc program loaded in %.1f s (%.0f Hz, %s, depth %d, ring %d KiB)",
            self.load_s,
            self.hz,
            "the scheduler's tick" if self.tick is not None else "a cpu-clock perf event",
            self.max_depth,
            pages * bpf_common.PAGE_SIZE // 1024,
        )

    def _choose_clock(self, no_tick):
        """With "auto": the tick where the timer costs a busy thread more than
        timer_cost.MAX_TIMER_COST (measured here, now), else the timer;
        `no_tick` is why the tick is not usable, or None."""
        if no_tick is None:
            self.timer_cost = timer_cost.measure(self.hz)
        return timer_cost.choose(self.timer_cost, no_tick)

    def stop(self):
        if self._bpf is None:
            return
        self._stop.set()
        self._wake.set()
        self._hurry.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            self._detach()
        with self._drain_lock:
            self.drain()
            self._flush_unwind(force=True)
            self._ring.close()
            self._sym_ring.close()
            self._counters.close()
            self._ring = None
            self._bpf.cleanup()
            self._bpf = None

    def covering(self):
        return self._bpf is not None

    @property
    def sample_hz(self):
        """Samples a second of a thread on CPU (its coverage rows say so: the
        views turn samples into time with it)."""
        return self.hz

    def detail(self):
        clock = "the scheduler's tick" if self.tick is not None else "a cpu-clock perf event"
        return (
            f"{self.hz:g} Hz per tracked thread on CPU ({clock}), Python frames up to depth "
            f"{self.max_depth} (CPython 3.10-3.13, from each client's report), native leaf "
            f"symbolized ({self._symbolizer()}); BPF loaded in {self.load_s:.1f} s"
            + (f"; {self.clock_why}" if self.clock_why else "")
        )

    def _symbolizer(self):
        if self.stacks.natives.use_bcc:
            return "bcc"
        return (
            "from the maps and ELF files: this bcc's symbolizer closes a stale file "
            "descriptor each use, fixed in bcc 0.33"
        )

    # ----- perf events -------------------------------------------------------------------
    def _attach_if_needed(self):
        """Perf events on every CPU while something is tracked, none otherwise
        (so a daemon with nothing to trace costs no CPU a timer tick)."""
        want = bool(self._procs) and self._bpf is not None
        if want and not self._attached:
            if self.tick is not None:
                self._bpf.attach_tracepoint(tp=kernel_tick.TRACEPOINT.encode(), fn_name=TICK_FN)
            else:
                self._bpf.attach_perf_event(
                    ev_type=perf_events.PERF_TYPE_SOFTWARE,
                    ev_config=perf_events.PERF_COUNT_SW_CPU_CLOCK,
                    fn_name=b"on_sample",
                    sample_period=max(1, int(1e9 / self.hz)),
                    cpu=-1,
                )
            self._attached = True
            self._wake.set()
        elif not want and self._attached:
            self._detach()

    def _detach(self):
        if self._attached:
            try:
                if self.tick is not None:
                    self._bpf.detach_tracepoint(tp=kernel_tick.TRACEPOINT.encode())
                else:
                    self._bpf.detach_perf_event(
                        ev_type=perf_events.PERF_TYPE_SOFTWARE,
                        ev_config=perf_events.PERF_COUNT_SW_CPU_CLOCK,
                    )
            except Exception as exc:  # already closed: nothing left to stop
                log.debug("cpu probe: detach: %s", exc)
            self._attached = False

    @property
    def attached(self):
        return self._attached

    # ----- who is sampled ------------------------------------------------------------------
    def track(self, pid):
        pid = int(pid)
        with self._lock:
            proc = self._procs.get(pid)
            if proc is None:
                self._gen += 1
                proc = self._procs[pid] = _Proc(pid, self._gen)
                if self._bpf is not None:
                    self._write_layout(proc)
            self._attach_if_needed()

    def untrack(self, pid):
        pid = int(pid)
        with self._lock:
            if pid not in self._procs:
                return
            proc = self._procs.pop(pid)
            self.refusals.pop(pid, None)
            if self._bpf is not None:
                try:
                    del self._bpf[b"tracked"][ct.c_uint32(pid)]
                except KeyError:
                    pass
                tst = self._bpf[b"tstates"]
                for tid in proc.tids:
                    try:
                        del tst[ct.c_uint32(tid)]
                    except KeyError:
                        pass
            self._attach_if_needed()
        # Its last samples are resolved, then its tables forgotten, by a drain:
        # this one when the reader is not draining (its native leaves named
        # while its maps may still be read), else the reader's next.
        self._departed.append(pid)
        if self._drain_lock.acquire(blocking=False):
            try:
                if self._bpf is not None:
                    self.drain()
            finally:
                self._drain_lock.release()

    def _write_layout(self, proc):
        """The process's `tracked` entry: its accepted layout, or native-only."""
        leaf = proc.layout
        if leaf is None:
            leaf = self._bpf[b"tracked"].Leaf()  # zeroed: frame_kind 0 = native leaf only
        leaf.gen = proc.gen
        self._bpf[b"tracked"][ct.c_uint32(proc.pid)] = leaf
        tst = self._bpf[b"tstates"]
        for tid, addr in proc.tids.items():
            tst[ct.c_uint32(tid)] = ct.c_uint64(addr)

    # ----- the client's report (ingest hands it over; service/server.py wires it) -----------
    def accept_layout(self, pid, run_id, info):
        """A PYLAYOUT report of `pid` (a dict from JSON, untrusted): None when
        its Python frames are sampled from now on, else why not (a sentence;
        the process is then sampled with its native leaf only)."""
        pid = int(pid)
        with self._lock:
            proc = self._procs.get(pid)
            if proc is None:
                return "process not tracked"
            why = None
            try:
                try:
                    fields, version = self.check_layout(info)
                    leaf = self._leaf(fields)
                except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
                    raise Refused(f"malformed report ({type(exc).__name__}: {exc})") from None
            except Refused as exc:
                why = str(exc)
            version_claimed = info.get("version")
            python = "?"
            if isinstance(version_claimed, list):
                python = ".".join(str(v) for v in version_claimed[:3])[:40] or "?"
            if why is not None:
                proc.layout = None
                proc.status = f"refused: {why}"
                self.refusals[pid] = why
                if self._bpf is not None:
                    self._write_layout(proc)
                self._status(
                    "degraded",
                    f"pid {pid} (run {run_id}, Python {python}): Python frames off: {why}; "
                    "native leaves only",
                )
                return why
            proc.layout = leaf
            proc.version = version
            proc.status = "ok"
            self.refusals.pop(pid, None)
            self.stacks.set_version(pid, version)
            if self._bpf is not None:
                self._write_layout(proc)
            verified = info.get("verified") or ["?", "?"]
            self._status(
                "active",
                f"pid {pid} (run {run_id}): CPython {python} frames on (layout from "
                f"{info.get('layout_source') or 'the table'}, checked against "
                f"{verified[0]} live threads, {verified[1]} frames)",
            )
            return None

    def set_threads(self, pid, run_id, threads, more=False):
        """The (tid, PyThreadState address) list of `pid` now (ingest kept only
        the peer's own threads); replaces the previous one."""
        pid = int(pid)
        with self._lock:
            proc = self._procs.get(pid)
            if proc is None or proc.layout is None:
                return
            new = {int(t): int(a) for t, a in threads}
            if self._bpf is not None:
                tst = self._bpf[b"tstates"]
                for tid in set(proc.tids) - set(new):
                    try:
                        del tst[ct.c_uint32(tid)]
                    except KeyError:
                        pass
                for tid, addr in new.items():
                    if proc.tids.get(tid) != addr:
                        tst[ct.c_uint32(tid)] = ct.c_uint64(addr)
            proc.tids = new

    def _status(self, state, detail):
        if self._sink is not None:
            self._sink.status(self.name, self.backend, state, detail)

    @staticmethod
    def check_layout(info):
        """({struct pylayout field: value}, (major, minor)) from a report, or
        Refused(why); needs no kernel (the tests call it on forged reports)."""
        status = info.get("status")
        if status != "ok":
            raise Refused(str(status or "no status").removeprefix("refused: ")[:300])
        version = tuple(int(v) for v in info["version"][:2])
        why = pyoffsets.refusal(
            version,
            bool(info.get("free_threaded")),
            str(info.get("implementation", "?")),
            str(info.get("machine", "x86_64")),
        )
        if why:
            raise Refused(why)
        if not info.get("verified"):
            raise Refused("layout not verified against the live interpreter")
        lay = info["layout"]
        if not isinstance(lay, dict):
            raise Refused("malformed report (layout is not an object)")
        for key in pyoffsets.LAYOUT_KEYS:
            if not isinstance(lay.get(key), int) or isinstance(lay.get(key), bool):
                raise Refused(f"malformed report (layout.{key} missing or not an integer)")
        if lay["frame_kind"] != pyoffsets.LAYOUTS[version]["frame_kind"]:
            raise Refused(
                f"frame kind {lay['frame_kind']} is not CPython {version[0]}.{version[1]}'s"
            )
        for rk, fields in pyoffsets.HEAD_FIELDS.items():
            head = HEADS[_HEAD_OF[rk]]
            size = lay[rk]
            if not 0 < size <= head:
                raise Refused(f"{rk} {size} outside 1..{head}")
            for key, width in fields:
                off = lay[key]
                if off == pyoffsets.NONE:
                    continue
                if off < 0 or off + width > size or off % width:
                    raise Refused(f"offset {key}={off} outside its {size}-byte head or unaligned")
        for key in ("cframe_frame", "co_code_adaptive", "str_ascii_data", "str_compact_data",
                    "str_utf8_length", "str_utf8", "bytes_size", "bytes_data"):  # fmt: skip
            if not pyoffsets.NONE <= lay[key] < 4096:
                raise Refused(f"offset {key}={lay[key]} out of range")
        types = info["types"]
        addrs = {k: int(types[k]) for k in ("code", "str", "bytes")}
        for k, a in addrs.items():
            if not 4096 <= a < USER_ADDR_MAX:
                raise Refused(f"type address {k}={a:#x} is not a user-space address")
        gil = lay["gil_holder"]
        if gil and not 4096 <= gil < USER_ADDR_MAX:
            raise Refused(f"GIL holder address {gil:#x} is not a user-space address")
        fields = {
            "code_type": addrs["code"],
            "str_type": addrs["str"],
            "bytes_type": addrs["bytes"],
            "gil_holder": gil,
            "version": (version[0] << 8) | version[1],
            "frame_kind": lay["frame_kind"],
            "has_cframe": int(lay["cframe_frame"] != pyoffsets.NONE),
            "owner_cstack": lay["owner_cstack"],
            "ts_frame": lay["ts_frame"],
            "cframe_frame": max(0, lay["cframe_frame"]),
            "pthread_tid": lay["pthread_tid"],
            "ts_pthread": lay["ts_thread_id"] if lay["pthread_tid"] >= 0 else -1,
            "co_name": lay["co_qualname" if lay["co_qualname"] != pyoffsets.NONE else "co_name"],
            "co_code_adaptive": max(0, lay["co_code_adaptive"]),
        }
        fields.update({field: lay[key] for field, key in _COPIED.items()})
        return fields, version

    def _leaf(self, fields):
        """A `struct pylayout` (bcc's ctypes Leaf of `tracked`) holding `fields`."""
        if self._bpf is None:
            raise Refused("the CPU probe is not loaded")
        leaf = self._bpf[b"tracked"].Leaf()
        for name, value in fields.items():
            setattr(leaf, name, value)
        return leaf

    # ----- reading -----------------------------------------------------------------------------
    def _reader(self):
        ring = self._ring
        # A ring more than half full raises the reader to normal priority
        # until it is drained (the reader itself, threads.keep_up, or the main
        # loop, threads.check_backlogs; the main loop lowers it again).
        # A ring past threads.HURRY_ABOVE ends the wait at the main loop's
        # next tick: the wait may run to twice poll_s when no gap comes.
        daemon_threads.background("cpu-sampler", backlog=ring.fill, hurry=self._hurry.set)
        t_cpu = time.thread_time_ns()
        cadence = bpf_common.Cadence(self.poll_s, busy_max_s=0.2, idle_max_s=0.5, batch_records=32)
        wait_s = self.poll_s
        while True:
            periodic_wait(self._hurry, wait_s)  # stop() sets it too
            if self._stop.is_set():
                break
            if not self._attached and not self._departed:
                # nothing tracked, no perf event: nothing comes until track() wakes us
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
                if self._stop.is_set():
                    break
            try:
                daemon_threads.keep_up()
                wait_s = cadence.next(self.drain())
                if time.monotonic() - self._last_sweep >= SWEEP_INTERVAL_S:
                    self.sweep()
            except Exception:  # a failing sink must not kill the reader
                log.exception("cpu probe: reader error")
            now_cpu = time.thread_time_ns()
            self._reader_cpu_ns += now_cpu - t_cpu
            t_cpu = now_cpu

    def drain(self):
        """Samples and symbols committed so far, to the sink; returns samples read."""
        with self._drain_lock:
            if self._ring is None:
                return 0
            # The samples are read in the ring, not copied (RingReader.peek:
            # ~130 of a record's 1,064 bytes are used), and handed back
            # once resolve() has copied out what it keeps.
            recs = self._ring.peek()
            try:
                syms = self._sym_ring.read()  # after the samples: theirs are all in
                self.drains += 1
                if len(syms):
                    self.symbols += len(syms)
                    self.stacks.add_symbols(syms)
                n = len(recs)
                self.samples += n
                parts = []
                reader = threading.current_thread() is self._thread
                for lo in range(0, n, DRAIN_CHUNK):
                    if lo and reader:  # a backlog: raise the reader if it is past half
                        daemon_threads.keep_up()
                    tables = self.stacks.resolve(recs[lo : lo + DRAIN_CHUNK])
                    self._note_unwind(
                        tables["cpu_samples"]["unwind"], tables["cpu_samples"]["ts_ns"]
                    )
                    parts.append(tables)
            finally:
                del recs
                self._ring.release()
            for tables in parts:
                for table in ("cpu_frames", "cpu_stacks", "cpu_samples"):
                    if table in tables:
                        self._sink.append(table, tables[table])
            self._check_losses()
            self._flush_unwind()
            self._forget_departed()
            return n

    def _forget_departed(self):
        """The stack tables' entries of processes untracked since the last drain
        (their samples were all in this one: untrack() removed them from
        `tracked` first). One tracked again meanwhile keeps its entries."""
        while self._departed:
            pid = self._departed.popleft()
            with self._lock:
                if pid not in self._procs:
                    self.stacks.forget_pid(pid)

    def _note_unwind(self, unwind, ts):
        """Count the unwinder's failures of a batch (a dictionary array)."""
        if unwind.null_count == len(unwind):
            return  # every frame walked: the common case
        codes = unwind.indices.fill_null(-1).to_numpy(zero_copy_only=False)
        failed = codes >= 0
        names = unwind.dictionary.to_pylist()
        for code in np.unique(codes[failed]).tolist():
            hit = failed & (codes == code)
            reason = names[code]
            n = int(hit.sum())
            t = ts[hit]
            got = self._unwind.setdefault(reason, [0, int(t.min()), int(t.max())])
            got[0] += n
            got[1] = min(got[1], int(t.min()))
            got[2] = max(got[2], int(t.max()))
            self._unwind_total[reason] += n

    def _flush_unwind(self, force=False):
        now = time.monotonic_ns()
        if not self._unwind or (
            not force and now - self._unwind_since_ns < UNWIND_LOSS_INTERVAL_NS
        ):
            return
        for reason, (count, first, last) in self._unwind.items():
            self._sink.loss(self.name, first, last, count, UNWIND_LOSSES[reason])
        self._unwind = {}
        self._unwind_since_ns = now

    def _check_losses(self):
        now = time.monotonic_ns()
        counts = self._counters.read()
        for key, reason in RING_LOSSES.items():
            delta = counts[key] - self._lost_seen[key]
            if delta > 0:
                self._sink.loss(self.name, self._lost_since_ns, now, int(delta), reason)
                self._lost_seen[key] = counts[key]
        self._lost_since_ns = now

    def sweep(self):
        """Drop `tstates` entries of threads whose process is not tracked (the
        program adds entries itself through the GIL-holder fallback, so the
        reported lists do not cover them all). Returns entries dropped."""
        self._last_sweep = time.monotonic()
        with self._lock:
            if self._bpf is None:
                return 0
            keys = list(self._bpf[b"tstates"].keys())
            pids = set(self._procs)
        # /proc is read without the lock (the main loop takes it for a
        # client's reports); a process tracked or dropped meanwhile makes
        # this sweep a no-op, the next one runs in SWEEP_INTERVAL_S.
        gone = [
            key
            for key in keys
            if not any(os.path.exists(f"{self.proc_root}/{pid}/task/{key.value}") for pid in pids)
        ]
        dropped = 0
        with self._lock:
            if self._bpf is None or set(self._procs) != pids:
                return 0
            tst = self._bpf[b"tstates"]
            for key in gone:
                try:
                    del tst[key]
                    dropped += 1
                except KeyError:
                    pass
        return dropped

    def program_stats(self):
        return bpf_common.program_stats(self._bpf) if self._bpf is not None else {}

    def counts(self):
        with self._lock:
            return self._counters.read() if self._counters is not None else {}

    def status(self):
        with self._lock:
            procs = {pid: p.status for pid, p in self._procs.items()}
            counts = self._counters.read() if self._counters is not None else {}
        return {
            "backend": self.backend,
            "attached": self._attached,
            "hz": self.hz,
            "max_depth": self.max_depth,
            "tracked": procs,
            "samples": self.samples,
            "symbols": self.symbols,
            "drains": self.drains,
            "frames_written": self.stacks.frames_written,
            "stacks_written": self.stacks.stacks_written,
            "native_lookups": self.stacks.natives.lookups,
            "unknown_frames": self.stacks.unknown_frames,
            "lost": dict(self._lost_seen),
            "unwind_failures": dict(self._unwind_total),
            "kernel_counters": counts,
            "reader_cpu_ns": self._reader_cpu_ns,
            "load_s": self.load_s,
            "record_bytes": getattr(self, "record_bytes", None),
        }
