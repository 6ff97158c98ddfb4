"""perf_event_open scheduling probe (fallback without BPF): context-switch records and tracepoint samples.

For every thread of a tracked process and every CPU it opens a software
dummy event with `context_switch=1` (PERF_RECORD_SWITCH, whose misc flag
SWITCH_OUT_PREEMPT marks involuntary switch-outs) and `use_clockid` =
CLOCK_MONOTONIC; per CPU it opens `sched:sched_wakeup`, `sched_wakeup_new`
and `sched_migrate_task` tracepoint events filtered to the tracked tids
(per-task tracepoint events fire only while the task runs, so wakeups and
migrations need CPU-wide ones), plus one per-thread CPU_MIGRATIONS software
counter for exact totals. All events of a CPU write into one mmapped ring
(PERF_EVENT_IOC_SET_OUTPUT). A reader thread drains the rings every
`sched_poll_ms`, merges them in time order and pairs switch-out/switch-in
per thread in user space. Threads born later are found by rescanning
/proc/PID/task; their first wakeup before that rescan is not seen. The
syscall, struct and ring code is in perf_events.py. It must never leave an
event open after `stop()` or `untrack()`.
"""

import ctypes as ct
import errno
import logging
import os
import struct
import threading
import time

from stallscope import threads
from stallscope.probes.base import Probe
from stallscope.probes.perf_events import (
    CLOCK_MONOTONIC,
    CONTEXT_SWITCH,
    PERF_COUNT_SW_CPU_MIGRATIONS,
    PERF_COUNT_SW_DUMMY,
    PERF_EVENT_IOC_SET_FILTER,
    PERF_EVENT_IOC_SET_OUTPUT,
    PERF_RECORD_LOST,
    PERF_RECORD_MISC_SWITCH_OUT,
    PERF_RECORD_MISC_SWITCH_OUT_PREEMPT,
    PERF_RECORD_SAMPLE,
    PERF_RECORD_SWITCH,
    PERF_SAMPLE_CPU,
    PERF_SAMPLE_RAW,
    PERF_SAMPLE_TID,
    PERF_SAMPLE_TIME,
    PERF_TYPE_SOFTWARE,
    PERF_TYPE_TRACEPOINT,
    SAMPLE_ID_ALL,
    TRACEFS,
    USE_CLOCKID,
    PerfEventAttr,
    Ring,
    ioctl,
    online_cpus,
    perf_event_open,
    tracepoint,
    tracepoints_deliver,
)

log = logging.getLogger(__name__)

RING_DATA_PAGES = 256  # per CPU, a power of two: 1 MiB
HOLDBACK_NS = 2_000_000  # records newer than this may still be in flight on another CPU


class PerfSchedProbe(Probe):
    """Kernel scheduling events of tracked processes through perf_event_open."""

    name = "sched"
    backend = "perf"

    @classmethod
    def unavailable(cls, settings=None):
        if not os.path.exists(f"{TRACEFS}/events/sched/sched_wakeup/id"):
            return f"tracefs not mounted at {TRACEFS}: mount -t tracefs tracefs {TRACEFS}"
        attr = PerfEventAttr(type=PERF_TYPE_SOFTWARE, config=PERF_COUNT_SW_DUMMY)
        try:
            os.close(perf_event_open(attr, -1, 0))
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                return (
                    "needs root or CAP_PERFMON (CPU-wide perf events; or "
                    "sysctl kernel.perf_event_paranoid=-1)"
                )
            if exc.errno == errno.ENOSYS:
                return "kernel built without perf events (CONFIG_PERF_EVENTS)"
            return f"perf_event_open failed: {exc.strerror}"
        if not tracepoints_deliver():
            return (
                "perf gets no sched tracepoint events: a BPF program that "
                "returns 0 is attached to them (e.g. a bcc tool or another "
                "stallscope daemon running the bcc backend), which suppresses "
                "perf's copies; stop it, or use the bcc backend"
            )
        return None

    def __init__(self, settings=None):
        super().__init__(settings)
        self.poll_s = self.settings.sched_poll_ms / 1000.0
        self.rescan_s = self.settings.sched_rescan_ms / 1000.0
        self.proc_root = self.settings.proc_root
        self.cpus = online_cpus()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = None
        self._sink = None
        self._rings = {}  # cpu -> Ring
        self._tp = {}  # name -> (id, fields, {cpu: fd})
        self._tracked = {}  # pid -> {tid: [switch fds..., migration counter fd]}
        self._tid_pid = {}
        self._state = {}  # tid -> [out_ns, out_cpu, preempted, runnable_ns]
        self._held = []  # records newer than the holdback cutoff
        self._lost = 0
        self._records = 0
        self._rows = {"offcpu": 0, "runq": 0, "migrations": 0}
        self._reader_cpu_ns = 0
        self._last_scan = 0.0
        self._lost_since_ns = time.monotonic_ns()

    # -- lifecycle -------------------------------------------------------------

    def start(self, sink):
        self._sink = sink
        for cpu in self.cpus:
            # A CPU-wide dummy that records nothing owns the CPU's ring; the
            # kernel refuses SET_OUTPUT between events on different clocks.
            owner = perf_event_open(
                PerfEventAttr(
                    type=PERF_TYPE_SOFTWARE,
                    config=PERF_COUNT_SW_DUMMY,
                    flags=USE_CLOCKID,
                    clockid=CLOCK_MONOTONIC,
                ),
                -1,
                cpu,
            )
            self._rings[cpu] = Ring(owner, RING_DATA_PAGES)
        for name in ("sched_wakeup", "sched_wakeup_new", "sched_migrate_task"):
            tp_id, fields = tracepoint(name)
            self._tp[name] = (tp_id, fields, {})
        for pid in list(self._tracked):
            self._scan(pid)
        self._update_filters()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._reader, name="stallscope-sched-perf", daemon=True
        )
        self._thread.start()
        log.info("sched probe: perf_event_open backend on %d CPUs", len(self.cpus))

    def stop(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if not self._rings:
            return
        self.drain(final=True)
        with self._lock:
            for pid in list(self._tracked):
                self._close_pid(pid)
            for _, _, fds in self._tp.values():
                for fd in fds.values():
                    os.close(fd)
            self._tp.clear()
            for ring in self._rings.values():
                ring.close()
            self._rings.clear()

    # -- who is followed -------------------------------------------------------

    def track(self, pid):
        with self._lock:
            self._tracked.setdefault(int(pid), {})
            if self._rings:
                self._scan(int(pid))
                self._update_filters()

    def untrack(self, pid):
        with self._lock:
            self._close_pid(int(pid))
            if self._rings:
                self._update_filters()

    def _close_pid(self, pid):
        for tid, fds in self._tracked.pop(pid, {}).items():
            for fd in fds:
                os.close(fd)
            self._tid_pid.pop(tid, None)
            self._state.pop(tid, None)

    def _scan(self, pid):
        """Open events for threads not followed yet; close those that exited."""
        threads = self._tracked[pid]
        try:
            tids = {int(x) for x in os.listdir(f"{self.proc_root}/{pid}/task")}
        except OSError:
            tids = set()
        changed = False
        for tid in list(threads):
            if tid not in tids:
                for fd in threads.pop(tid):
                    os.close(fd)
                self._tid_pid.pop(tid, None)
                changed = True
        for tid in tids - set(threads):
            fds = []
            try:
                for cpu in self.cpus:
                    attr = PerfEventAttr(
                        type=PERF_TYPE_SOFTWARE,
                        config=PERF_COUNT_SW_DUMMY,
                        sample_type=PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU,
                        flags=SAMPLE_ID_ALL | USE_CLOCKID | CONTEXT_SWITCH,
                        clockid=CLOCK_MONOTONIC,
                    )
                    fd = perf_event_open(attr, tid, cpu)
                    fds.append(fd)
                    ioctl(fd, PERF_EVENT_IOC_SET_OUTPUT, self._rings[cpu].fd)
                # exact per-thread total, for status() and cross-checks
                fds.append(
                    perf_event_open(
                        PerfEventAttr(type=PERF_TYPE_SOFTWARE, config=PERF_COUNT_SW_CPU_MIGRATIONS),
                        tid,
                        -1,
                    )
                )
            except OSError as exc:
                for fd in fds:
                    os.close(fd)
                if exc.errno != errno.ESRCH:  # ESRCH: it exited meanwhile
                    log.warning("sched probe: cannot follow thread %d: %s", tid, exc.strerror)
                continue
            threads[tid] = fds
            self._tid_pid[tid] = pid
            changed = True
        return changed

    def _update_filters(self):
        """Reopen the CPU-wide tracepoint events filtered to the followed tids.

        A tracepoint event's filter can be set only once (EEXIST after), so
        the new events are opened before the old ones close: nothing is
        missed in between, and the few records both saw are dropped as
        duplicates when paired."""
        tids = sorted(self._tid_pid)
        # an empty set must match nothing
        expr = (" || ".join(f"pid == {t}" for t in tids) or "pid == 0 && pid == 1").encode()
        for name, (tp_id, fields, old) in list(self._tp.items()):
            new = {}
            try:
                for cpu in self.cpus:
                    attr = PerfEventAttr(
                        type=PERF_TYPE_TRACEPOINT,
                        config=tp_id,
                        sample_period=1,
                        sample_type=PERF_SAMPLE_TIME | PERF_SAMPLE_CPU | PERF_SAMPLE_RAW,
                        flags=USE_CLOCKID,
                        clockid=CLOCK_MONOTONIC,
                    )
                    fd = perf_event_open(attr, -1, cpu)
                    new[cpu] = fd
                    ioctl(fd, PERF_EVENT_IOC_SET_FILTER, ct.c_char_p(expr))
                    ioctl(fd, PERF_EVENT_IOC_SET_OUTPUT, self._rings[cpu].fd)
            except OSError:
                for fd in new.values():
                    os.close(fd)
                raise
            self._tp[name] = (tp_id, fields, new)
            for fd in old.values():
                os.close(fd)

    # -- reading ---------------------------------------------------------------

    def _reader(self):
        threads.background("sched-perf")
        t_cpu = time.thread_time_ns()
        while not self._stop.wait(self.poll_s):
            try:
                now = time.monotonic()
                if now - self._last_scan >= self.rescan_s:
                    self._last_scan = now
                    with self._lock:
                        changed = [self._scan(pid) for pid in list(self._tracked)]
                        if any(changed):
                            self._update_filters()
                self.drain()
            except Exception:
                log.exception("sched probe: perf reader error")
            now_cpu = time.thread_time_ns()
            self._reader_cpu_ns += now_cpu - t_cpu
            t_cpu = now_cpu

    def drain(self, final=False):
        """Decode what the rings hold (up to the holdback cutoff unless final); returns rows."""
        with self._lock:
            cutoff = (1 << 63) if final else time.monotonic_ns() - HOLDBACK_NS
            recs = self._held
            for ring in self._rings.values():
                recs.extend(self._parse(ring.read()))
            recs.sort(key=lambda r: r[0])
            split = len(recs)
            while split and recs[split - 1][0] >= cutoff:
                split -= 1
            now, self._held = recs[:split], recs[split:]
            self._records += len(now)
            rows = self._pair(now)
            self._check_losses()
            return rows

    def _parse(self, data):
        """Records as tuples (ts, kind, tid, cpu, a, b): kind 'out'/'in'/'wake'/'mig'."""
        out = []
        wake_ids = {self._tp[n][0] for n in ("sched_wakeup", "sched_wakeup_new")}
        mig_id, mig_fields, _ = self._tp["sched_migrate_task"]
        wake_pid_off = self._tp["sched_wakeup"][1]["pid"][0]
        wnew_pid_off = self._tp["sched_wakeup_new"][1]["pid"][0]
        wnew_id = self._tp["sched_wakeup_new"][0]
        off = 0
        n = len(data)
        while off + 8 <= n:
            rtype, misc, size = struct.unpack_from("<IHH", data, off)
            if size == 0:
                break
            if rtype == PERF_RECORD_SWITCH:
                _pid, tid, ts, cpu = struct.unpack_from("<IIQI", data, off + 8)
                if misc & PERF_RECORD_MISC_SWITCH_OUT:
                    out.append(
                        (ts, "out", tid, cpu, bool(misc & PERF_RECORD_MISC_SWITCH_OUT_PREEMPT), 0)
                    )
                else:
                    out.append((ts, "in", tid, cpu, 0, 0))
            elif rtype == PERF_RECORD_SAMPLE:
                ts, cpu, _res, raw_size = struct.unpack_from("<QIII", data, off + 8)
                raw = off + 8 + 20
                common_type = struct.unpack_from("<H", data, raw)[0]
                if common_type == mig_id:
                    (tid,) = struct.unpack_from("<i", data, raw + mig_fields["pid"][0])
                    (src,) = struct.unpack_from("<i", data, raw + mig_fields["orig_cpu"][0])
                    (dst,) = struct.unpack_from("<i", data, raw + mig_fields["dest_cpu"][0])
                    if src != dst:
                        out.append((ts, "mig", tid, cpu, src, dst))
                elif common_type in wake_ids:
                    poff = wnew_pid_off if common_type == wnew_id else wake_pid_off
                    (tid,) = struct.unpack_from("<i", data, raw + poff)
                    out.append((ts, "wake", tid, cpu, 0, 0))
            elif rtype == PERF_RECORD_LOST:
                self._lost += struct.unpack_from("<Q", data, off + 16)[0]
            off += size
        return out

    def _pair(self, recs):
        cols = {
            "offcpu": {k: [] for k in ("pid", "tid", "start_ns", "end_ns", "preempted", "cpu")},
            "runq": {k: [] for k in ("pid", "tid", "start_ns", "end_ns", "cpu")},
            "migrations": {k: [] for k in ("pid", "tid", "ts_ns", "from_cpu", "to_cpu")},
        }
        state = self._state
        prev = None
        for rec in recs:
            if rec == prev:  # seen by both the old and new tracepoint events
                continue
            prev = rec
            ts, kind, tid, cpu, a, b = rec
            pid = self._tid_pid.get(tid)
            if pid is None:
                continue
            st = state.get(tid)
            if st is None:
                st = state[tid] = [0, 0, False, 0]
            if kind == "out":
                st[0], st[1], st[2] = ts, cpu, a
                st[3] = ts if a else 0  # preempted: runnable from now
            elif kind == "wake":
                st[3] = ts
            elif kind == "in":
                if st[0]:
                    c = cols["offcpu"]
                    c["pid"].append(pid)
                    c["tid"].append(tid)
                    c["start_ns"].append(st[0])
                    c["end_ns"].append(ts)
                    c["preempted"].append(st[2])
                    c["cpu"].append(st[1])
                if st[3]:
                    c = cols["runq"]
                    c["pid"].append(pid)
                    c["tid"].append(tid)
                    c["start_ns"].append(st[3])
                    c["end_ns"].append(ts)
                    c["cpu"].append(cpu)
                st[0] = st[3] = 0
            elif kind == "mig":
                c = cols["migrations"]
                c["pid"].append(pid)
                c["tid"].append(tid)
                c["ts_ns"].append(ts)
                c["from_cpu"].append(a)
                c["to_cpu"].append(b)
        rows = 0
        for table, c in cols.items():
            if c["tid"]:
                self._sink.append(table, c)
                self._rows[table] += len(c["tid"])
                rows += len(c["tid"])
        return rows

    def _check_losses(self):
        if self._lost:
            now = time.monotonic_ns()
            self._sink.loss(
                "sched",
                self._lost_since_ns,
                now,
                int(self._lost),
                "perf ring full: records dropped in the kernel (lower sched_poll_ms)",
            )
            self._lost = 0
            self._lost_since_ns = now

    def migrations_counted(self):
        """Exact per-thread CPU_MIGRATIONS counter totals since each thread was followed."""
        out = {}
        with self._lock:
            for threads in self._tracked.values():
                for tid, fds in threads.items():
                    out[tid] = struct.unpack("<Q", os.read(fds[-1], 8))[0]
        return out

    def status(self):
        return {
            "backend": self.backend,
            "resolution_ns": 0,  # event-exact
            "tracked": sorted(self._tracked),
            "threads": len(self._tid_pid),
            "records": self._records,
            "rows": dict(self._rows),
            "reader_cpu_ns": self._reader_cpu_ns,
            "poll_ms": self.poll_s * 1000,
        }
