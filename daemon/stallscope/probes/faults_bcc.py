"""Page-fault probe (bcc): user page faults of tracked threads, per thread and interval.

Loads `faults_bcc.c` on `exceptions:page_fault_user`, filtered in the kernel
to tracked tgids and summed per thread; an aggregate is closed by the kernel
once it spans `page_faults_flush_ms` and flushed by the reader once idle that
long, so each `page_faults` row is [first fault, last fault] of one thread
with their count. The tracepoint has no end event: `cost_ns` is the count
times a per-fault cost this probe calibrates on the host when it starts
(first-touching fresh pages in a thread of its own, counted both by the
program and by the kernel's minor-fault counter), reported in status() and
the probe_status detail. It must never run Python per fault.
"""

import ctypes as ct
import logging
import mmap
import resource
import statistics
import threading
import time

import numpy as np

from stallscope.probes.bpf_probe import BccTracepointProbe

log = logging.getLogger(__name__)

CALIB_PAGES = 1024
CALIB_ROUNDS = 5


def first_touch_cost(pages=CALIB_PAGES, on_thread=None):
    """(ns per first-touch fault, faults the kernel counted) for one round
    on the calling thread: time to write fresh pages minus the time to write
    them again once mapped. `on_thread(tid)` runs first (to point a counter
    at this thread)."""
    size = pages * mmap.PAGESIZE
    m = mmap.mmap(-1, size)
    try:
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            m.madvise(mmap.MADV_NOHUGEPAGE)  # one fault per 4 KiB page, not per 2 MiB
        buf = (ct.c_char * size).from_buffer(m)
        f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        t0 = time.monotonic_ns()
        ct.memset(buf, 1, size)
        t1 = time.monotonic_ns()
        ct.memset(buf, 2, size)
        t2 = time.monotonic_ns()
        faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0
        del buf
    finally:
        m.close()
    cost = ((t1 - t0) - (t2 - t1)) / max(faults, 1)
    return max(cost, 0.0), faults


class BccFaultsProbe(BccTracepointProbe):
    """First-touch and other user page faults of tracked threads."""

    name = "page_faults"
    source = "faults_bcc.c"
    tracepoints = ("exceptions:page_fault_user",)
    record_fields = ("start_ns", "end_ns", "pid", "tid", "count")
    loss_reasons = {
        "reserve_failed": "page-fault ring buffer full: fault counts dropped "
        "(raise kernel_ring_pages)",
        "aggs_full": "page-fault aggregate map full: faults of some threads not "
        "counted (raise kernel_max_tids)",
    }

    def __init__(self, settings=None):
        super().__init__(settings)
        self.flush_ns = int(self.settings.page_faults_flush_ms * 1e6)
        self.max_tids = int(self.settings.kernel_max_tids)
        self.sweep_s = max(self.poll_s, 0.1)
        self._last_sweep = 0.0
        self.cost_ns = None  # calibrated ns per fault
        self.calibration = {}

    def cflags(self):
        return [f"-DFLUSH_NS={self.flush_ns}", f"-DMAX_TIDS={self.max_tids}"]

    def _started(self):
        try:
            self.calibrate()
        except Exception as exc:  # a probe without a cost still counts faults
            log.warning("page_faults probe: calibration failed: %s", exc)
            self.calibration = {"error": str(exc)}

    def calibrate(self, rounds=CALIB_ROUNDS, pages=CALIB_PAGES):
        """Measure the cost of a first-touch fault on this host with the
        program attached, in a thread of our own; returns ns per fault."""
        calib = self._bpf[b"calib"]
        results = []

        def run():
            tid = threading.get_native_id()
            calib[ct.c_int(0)] = ct.c_uint64(tid)
            try:
                for _ in range(rounds):
                    before = calib[ct.c_int(1)].value
                    cost, faults = first_touch_cost(pages)
                    counted = calib[ct.c_int(1)].value - before
                    results.append((cost, faults, counted))
            finally:
                calib[ct.c_int(0)] = ct.c_uint64(0)

        t = threading.Thread(target=run, name="stallscope-fault-calibration")
        t.start()
        t.join()
        cost = statistics.median(r[0] for r in results)
        faults = sum(r[1] for r in results)
        counted = sum(r[2] for r in results)
        self.cost_ns = int(round(cost))
        self.calibration = {
            "cost_ns_per_fault": self.cost_ns,
            "rounds": rounds,
            "pages_per_round": pages,
            "faults_kernel": faults,
            "faults_counted": counted,
        }
        log.info(
            "page_faults probe: %d ns per first-touch fault (median of %d x %d pages; "
            "program counted %d of %d)",
            self.cost_ns,
            rounds,
            pages,
            counted,
            faults,
        )
        return self.cost_ns

    def detail(self):
        c = self.calibration
        if "cost_ns_per_fault" not in c:
            return f"fault cost not calibrated ({c.get('error', 'not run')}): cost_ns NULL"
        return (
            f"cost_ns = count x {c['cost_ns_per_fault']} ns per fault, calibrated at start "
            f"(median of {c['rounds']} x {c['pages_per_round']} first-touch 4 KiB pages; "
            f"program counted {c['faults_counted']} of the kernel's {c['faults_kernel']})"
        )

    # -- rows ----------------------------------------------------------------------

    def _rows(self, pid, tid, start, end, count):
        count = np.asarray(count, dtype=np.int64)
        cost = None if self.cost_ns is None else count * self.cost_ns
        return {
            "pid": np.asarray(pid, dtype=np.int32),
            "tid": np.asarray(tid, dtype=np.int32),
            "start_ns": np.asarray(start, dtype=np.int64),
            "end_ns": np.asarray(end, dtype=np.int64),
            "count": count.astype(np.int32),
            "cost_ns": cost if cost is not None else [None] * len(count),
        }

    def _emit(self, recs):
        self._append(
            "page_faults",
            self._rows(recs["pid"], recs["tid"], recs["start_ns"], recs["end_ns"], recs["count"]),
        )

    def _sweep(self, now_ns, final=False):
        now = time.monotonic()
        if not final and now - self._last_sweep < self.sweep_s:
            return
        self._last_sweep = now
        got = self.sweep_aggregates("aggs", self.flush_ns, now_ns, final)
        if got:
            self._append(
                "page_faults",
                self._rows(
                    [v.pid for _, v in got],
                    [k.value for k, _ in got],
                    [v.start_ns for _, v in got],
                    [v.last_ns for _, v in got],
                    [v.count for _, v in got],
                ),
            )

    def status(self):
        out = super().status()
        out["calibration"] = dict(self.calibration)
        out["flush_ms"] = self.flush_ns / 1e6
        return out
