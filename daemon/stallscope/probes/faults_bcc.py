"""Page-fault probe (bcc): user page faults of tracked threads and their time, per thread and interval.

Loads `faults_bcc.c` on `exceptions:page_fault_user`, `kmem:rss_stat` and
`sched:sched_switch`, filtered in the kernel to tracked tgids and summed per
thread; an aggregate is closed by the kernel once it spans
`page_faults_flush_ms` and flushed by the reader once idle that long, so
each `page_faults` row is [first fault, last fault] of one thread with their
count. The fault tracepoint has no end event, so the time of a fault is
measured in the faulting thread as its on-CPU time from the fault's entry
to its page's mapping (the RSS change the fault makes while the thread's
registers are still the fault's), or, for a fault that maps nothing, to the
thread's next fault when that is at most `page_fault_gap_us` away:
`measured` of a row's `count` faults had their time measured, `measured_ns`
in all. `cost_ns` adds the others at the mean of the measured faults: of the
same row, else of the same thread so far, else (a thread none of whose
faults could be measured yet) the per-fault cost this probe calibrates on
the host at start; `cost_method` says which. A kernel whose verifier refuses
the mapping end (no BTF task pointer) gets the next-fault measure alone,
and `runs.page_fault_method` says so. fentry/fexit on the fault handler
would time each fault exactly; it is refused on hosts like ours (EPERM), so
there is no such path. It must never run Python per fault.
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
# runs.page_fault_method for runs this probe covers (docs/kernel-causes.md):
# each fault timed to its page's mapping (else to the next fault), or, where
# the kernel refuses the mapping end, to the next fault alone
METHOD = "oncpu_to_mapping"
METHOD_NEXT_FAULT = "oncpu_to_next_fault"
# The return to user mode after a fault mapped its page, at most (the user
# work after it is not the fault's). Measured here from the mapping to the
# next fault of 4 KiB bursts: p50 0.65-0.95 us, p99 1.4-4.6 us, 0.02-0.4 %
# of them past 5 us (an IRQ meanwhile, which irq_time has anyway)
TAIL_NS = 5_000


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


# page_faults.cost_method: how the faults a row could not measure were priced
COST_METHODS = ("measured", "row_mean", "thread_mean", "calibrated", "none")


class BccFaultsProbe(BccTracepointProbe):
    """First-touch and other user page faults of tracked threads."""

    name = "page_faults"
    source = "faults_bcc.c"
    tracepoints = ("exceptions:page_fault_user", "sched:sched_switch")
    record_fields = ("start_ns", "end_ns", "pid", "tid", "count", "measured", "measured_ns")
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
        self.gap_ns = int(self.settings.page_fault_gap_us * 1000)
        self.cost_ns = None  # calibrated ns per fault: the last fallback
        self.calibration = {}
        # tid -> [measured ns, measured faults] so far (at most max_tids
        # threads, the oldest forgotten first)
        self._thread_means = {}
        self.faults = {"count": 0, "measured": 0, "measured_ns": 0, "cost_ns": 0}
        self.faults_by_method = dict.fromkeys(COST_METHODS, 0)
        # False when turned off, or once the kernel refused the mapping end
        self.map_end = bool(self.settings.page_fault_map_end)
        self.ended_at_map_swept = 0
        self.map_end_refused = None

    def cflags(self):
        return [
            f"-DFLUSH_NS={self.flush_ns}",
            f"-DMAX_TIDS={self.max_tids}",
            f"-DGAP_NS={self.gap_ns}",
            f"-DTAIL_NS={TAIL_NS}",
            f"-DMAP_END={int(self.map_end)}",
        ]

    @property
    def method(self):
        return METHOD if self.map_end else METHOD_NEXT_FAULT

    def start(self, sink):
        try:
            super().start(sink)
        except Exception as exc:
            if not self.map_end:
                raise
            # bpf_get_current_task_btf/bpf_task_pt_regs need BTF (5.11+), and
            # kmem:rss_stat its mm fields (5.5+): without them, the next fault
            self.map_end = False
            self.map_end_refused = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            log.warning(
                "page_faults probe: the kernel refused timing a fault to its page's mapping "
                "(%s); each fault is timed to the thread's next fault instead",
                self.map_end_refused,
            )
            super().start(sink)

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
        off = (
            "; mapping end off (probes.page_fault_map_end)"
            if not self.map_end and not self.map_end_refused
            else ""
        )
        fallback = (
            f"{c['cost_ns_per_fault']} ns per fault, calibrated at start (median of "
            f"{c['rounds']} x {c['pages_per_round']} first-touch 4 KiB pages in a daemon thread; "
            f"program counted {c['faults_counted']} of the kernel's {c['faults_kernel']})"
            if "cost_ns_per_fault" in c
            else f"none ({c.get('error', 'not calibrated')}): cost_ns NULL"
        )
        end = (
            "until its page is mapped (+ at most "
            f"{TAIL_NS / 1000:g} us back to user mode), else until its next fault"
            if self.map_end
            else "until its next fault"
        )
        return (
            f"method {self.method}: a fault's time is its thread's on-CPU time {end} when at "
            f"most {self.gap_ns / 1000:g} us (measured); the others at the mean "
            "of the measured faults of their row, else of their thread (cost_method); "
            f"for a thread with none measured yet: {fallback}"
            + (f"; mapping end refused: {self.map_end_refused}" if self.map_end_refused else "")
            + off
        )

    # -- rows ----------------------------------------------------------------------

    def _price(self, tid, count, measured, measured_ns):
        """(cost_ns, cost_method) of each row, in order: the measured time
        plus the unmeasured faults at the mean of the measured ones (row,
        then thread so far, then the calibration). A Python step per row,
        never per fault."""
        n = len(count)
        cost = [None] * n
        method = [None] * n
        means = self._thread_means
        for i in range(n):
            t, c, m, m_ns = int(tid[i]), int(count[i]), int(measured[i]), int(measured_ns[i])
            seen = means.pop(t, None)  # re-inserted: the dict keeps recency order
            if m:
                seen = [m_ns, m] if seen is None else [seen[0] + m_ns, seen[1] + m]
            if seen is not None:
                means[t] = seen
                if len(means) > self.max_tids:
                    del means[next(iter(means))]
            rest = c - m
            if rest <= 0:
                cost[i], method[i] = m_ns, "measured"
            elif m:
                cost[i], method[i] = m_ns + round(rest * m_ns / m), "row_mean"
            elif seen is not None:
                cost[i], method[i] = round(rest * seen[0] / seen[1]), "thread_mean"
            elif self.cost_ns is not None:
                cost[i], method[i] = rest * self.cost_ns, "calibrated"
            else:
                method[i] = "none"
            self.faults_by_method[method[i]] += c
        return cost, method

    def _rows(self, pid, tid, start, end, count, measured, measured_ns):
        count = np.asarray(count, dtype=np.int64)
        measured = np.asarray(measured, dtype=np.int64)
        measured_ns = np.asarray(measured_ns, dtype=np.int64)
        cost, method = self._price(tid, count, measured, measured_ns)
        f = self.faults
        f["count"] += int(count.sum())
        f["measured"] += int(measured.sum())
        f["measured_ns"] += int(measured_ns.sum())
        f["cost_ns"] += sum(c for c in cost if c is not None)
        return {
            "pid": np.asarray(pid, dtype=np.int32),
            "tid": np.asarray(tid, dtype=np.int32),
            "start_ns": np.asarray(start, dtype=np.int64),
            "end_ns": np.asarray(end, dtype=np.int64),
            "count": count.astype(np.int32),
            "cost_ns": cost,
            "measured": measured.astype(np.int32),
            "measured_ns": measured_ns,
            "cost_method": method,
        }

    def _emit(self, recs):
        self._append(
            "page_faults",
            self._rows(
                recs["pid"],
                recs["tid"],
                recs["start_ns"],
                recs["end_ns"],
                recs["count"],
                recs["measured"],
                recs["measured_ns"],
            ),
        )

    def _sweep(self, now_ns, final=False):
        now = time.monotonic()
        if not final and now - self._last_sweep < self.sweep_s:
            return
        self._last_sweep = now
        got = self.sweep_aggregates("aggs", self.flush_ns, now_ns, final)
        if got:
            # an interval's last fault, still open at the flush, is measured
            # if it mapped its page (its return to user mode left out)
            mapped = [1 if v.open and v.map_ns else 0 for _, v in got]
            self.ended_at_map_swept += sum(mapped)
            self._append(
                "page_faults",
                self._rows(
                    [v.pid for _, v in got],
                    [k.value for k, _ in got],
                    [v.start_ns for _, v in got],
                    [v.last_ns for _, v in got],
                    [v.count for _, v in got],
                    [v.measured + m for (_, v), m in zip(got, mapped, strict=True)],
                    [v.measured_ns + m * v.map_ns for (_, v), m in zip(got, mapped, strict=True)],
                ),
            )

    def status(self):
        out = super().status()
        out["calibration"] = dict(self.calibration)
        out["flush_ms"] = self.flush_ns / 1e6
        out["method"] = self.method
        out["gap_us"] = self.gap_ns / 1000
        out["faults"] = dict(self.faults)
        out["faults_by_cost_method"] = dict(self.faults_by_method)
        out["map_end"] = self.map_end
        if self._counters is not None:
            counts = self._counters.read()
            # how each measured fault's time ended (the flush's mapped ones too)
            out["measured_faults_ended_at"] = {
                "mapping": counts["ended_at_map"] + self.ended_at_map_swept,
                "next_fault": counts["ended_at_next"],
            }
        return out
