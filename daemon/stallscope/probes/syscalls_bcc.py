"""Syscall probe (bcc): time tracked threads spend in system calls, by syscall.

Loads `syscalls_bcc.c` on raw_syscalls:sys_enter/sys_exit, filtered in the
kernel to tracked tgids. A call of at least `syscall_threshold_us` becomes
one exact `syscalls` row (count 1); shorter calls are summed per (thread,
syscall) in the kernel and written as one row per `syscalls_flush_ms` of
activity (count, total_ns over [first entry, last exit]). Attaching these
tracepoints slows every syscall on the host (BENCHMARKS.md), so this probe
is detachable: loaded at start, attached only in deep mode or during a
diagnosis window (the daemon's coverage rows say when). It must never run
Python per syscall.
"""

import logging
import time

import numpy as np
import pyarrow as pa

from stallscope.probes.bpf_probe import BccTracepointProbe

log = logging.getLogger(__name__)


def syscall_names():
    """{nr: name} for this architecture, from bcc's table."""
    try:
        from bcc.syscall import syscalls
    except ImportError:
        return {}
    return {int(nr): name.decode() for nr, name in syscalls.items()}


class BccSyscallsProbe(BccTracepointProbe):
    """System calls of tracked threads, in the kernel: long ones exact, short ones summed."""

    name = "syscalls"
    source = "syscalls_bcc.c"
    tracepoints = ("raw_syscalls:sys_enter", "raw_syscalls:sys_exit")
    record_fields = ("start_ns", "end_ns", "total_ns", "pid", "tid", "nr", "count")
    loss_reasons = {
        "reserve_failed": "syscall ring buffer full: syscall rows dropped "
        "(raise kernel_ring_pages or syscall_threshold_us)",
        "aggs_full": "syscall aggregate map full: short syscalls not counted "
        "(raise kernel_max_tids)",
        "inflight_full": "syscall in-flight map full: syscalls not timed (raise kernel_max_tids)",
    }
    detachable = True

    def __init__(self, settings=None):
        super().__init__(settings)
        self.threshold_ns = int(float(self.settings.syscall_threshold_us) * 1000)
        self.flush_ns = int(self.settings.syscalls_flush_ms * 1e6)
        self.sweep_s = max(self.poll_s, 0.1)
        self._last_sweep = 0.0
        self._names = syscall_names()

    def cflags(self):
        n = int(self.settings.kernel_max_tids)
        return [
            f"-DTHRESHOLD_NS={self.threshold_ns}",
            f"-DFLUSH_NS={self.flush_ns}",
            f"-DMAX_TIDS={n}",
            f"-DMAX_AGGS={n}",
        ]

    def detach(self):
        super().detach()
        if self._bpf is not None:
            # calls in flight at the detach must not pair with an exit seen
            # after the next attach
            self._bpf[b"inflight"].clear()

    def untrack(self, pid):
        super().untrack(pid)
        if self._bpf is None:
            return
        table = self._bpf[b"inflight"]
        for key, value in table.items():
            if value.pid == int(pid):
                try:
                    del table[key]
                except KeyError:
                    pass

    def _rows(self, pid, tid, nr, start, end, count, total):
        nr = np.asarray(nr, dtype=np.int32)
        names = {int(n): self._names.get(int(n), f"[unknown: {int(n)}]") for n in np.unique(nr)}
        return {
            "pid": np.asarray(pid, dtype=np.int32),
            "tid": np.asarray(tid, dtype=np.int32),
            "nr": nr,
            "name": pa.array([names[int(n)] for n in nr], type=pa.string()),
            "start_ns": np.asarray(start, dtype=np.int64),
            "end_ns": np.asarray(end, dtype=np.int64),
            "count": np.asarray(count, dtype=np.int32),
            "total_ns": np.asarray(total, dtype=np.int64),
        }

    def _emit(self, recs):
        self._append(
            "syscalls",
            self._rows(
                recs["pid"],
                recs["tid"],
                recs["nr"],
                recs["start_ns"],
                recs["end_ns"],
                recs["count"],
                recs["total_ns"],
            ),
        )

    def _sweep(self, now_ns, final=False):
        now = time.monotonic()
        if not final and now - self._last_sweep < self.sweep_s:
            return
        self._last_sweep = now
        got = self.sweep_aggregates("aggs", self.flush_ns, now_ns, final)
        if got:
            self._append(
                "syscalls",
                self._rows(
                    [v.pid for _, v in got],
                    [k.tid for k, _ in got],
                    [k.nr for k, _ in got],
                    [v.start_ns for _, v in got],
                    [v.last_ns for _, v in got],
                    [v.count for _, v in got],
                    [v.total_ns for _, v in got],
                ),
            )

    def status(self):
        out = super().status()
        out["threshold_us"] = self.threshold_ns / 1000
        out["flush_ms"] = self.flush_ns / 1e6
        return out
