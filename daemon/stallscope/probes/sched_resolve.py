"""Who took the CPU or woke a thread: offcpu's preemptor_* and waker_* columns.

The sched program records, per off-CPU interval, one "other" task: for a
preempted interval the task switched in (sched_switch next_*), for a blocked
one the thread that woke it (sched_waking in the waker's context), or a flag
saying the wakeup came from interrupt context. The kernel side knows the
preemptor's tgid only when it is a followed thread or when it hands the CPU
back directly; otherwise this module reads it from /proc/TID/status (cached,
bounded), and leaves it NULL for a task already gone, unless that task was
one of the daemon's own threads (stallscope.threads remembers their tids):
a daemon thread that preempted a traced one and ended before the drain is
still named as the daemon. It must never block on anything but a procfs
read and never raise into the reader.
"""

import os

import numpy as np

from stallscope import threads
from stallscope.probes.bpf_common import decode_comm, nullable


class TgidResolver:
    """tid -> tgid from procfs, cached; for a task gone, the daemon's pid if
    it was a daemon thread, else 0."""

    MAX_CACHED = 8192

    def __init__(self, proc_root="/proc"):
        self.proc_root = proc_root
        self._cache = {}
        self.lookups = 0

    def tgid(self, tid):
        got = self._cache.get(tid)
        if got is not None:
            return got
        self.lookups += 1
        tgid = 0
        try:
            with open(f"{self.proc_root}/{tid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Tgid:"):
                        tgid = int(line.split()[1])
                        break
        except (OSError, ValueError):
            # gone (or never a task): not cached, the tid may be reused
            return os.getpid() if threads.was_own_thread(tid) else 0
        if len(self._cache) >= self.MAX_CACHED:
            self._cache.clear()  # tids get reused: a bounded, short memory
        self._cache[tid] = tgid
        return tgid

    def fill(self, tids, pids):
        """pids with the zeros for nonzero tids filled in from procfs."""
        missing = (pids == 0) & (tids != 0)
        if missing.any():
            pids = pids.copy()
            for i in np.flatnonzero(missing):
                pids[i] = self.tgid(int(tids[i]))
        return pids


def who_columns(off, resolver):
    """preemptor_* / waker_* / waker_irq / wakeup_ns for offcpu rows `off`."""
    preempted = off["preempted"].astype(bool)
    tids = off["other_tid"].astype(np.int64)
    pids = off["other_pid"].astype(np.int64)
    irq = off["other_irq"].astype(bool)
    named = tids != 0
    pre = preempted & named
    if pre.any():
        pids = np.where(pre, resolver.fill(tids * pre, pids * pre), pids)
    wake = ~preempted & named
    blocked = ~preempted
    pre_comm, wake_comm = decode_comm(off["other_comm"], pre, wake)
    return {
        "preemptor_pid": nullable(pids, pre & (pids != 0), np.int32),
        "preemptor_tid": nullable(tids, pre, np.int32),
        "preemptor_comm": pre_comm,
        "waker_pid": nullable(pids, wake, np.int32),
        "waker_tid": nullable(tids, wake, np.int32),
        "waker_comm": wake_comm,
        # known only where a wakeup was seen: by a thread (false) or not (true)
        "waker_irq": nullable(irq, blocked & (irq | named), bool),
        # the blocked part ends when the thread became runnable (sched_wakeup,
        # the same instant runq.start_ns records)
        "wakeup_ns": nullable(off["b_ns"], blocked & (off["b_ns"] != 0), np.int64),
        **prev_columns(off),
    }


def prev_columns(off):
    """prev_pid / prev_comm / prev_run_ns: the task that held the CPU until
    the thread's switch-in that ends each offcpu row, and how long it had
    run there (NULL where the program did not see its switch-in)."""
    if "prev_run_ns" not in off.dtype.names:
        return {}
    run = off["prev_run_ns"].astype(np.int64)
    seen = run > 0
    (comm,) = decode_comm(off["prev_comm"], seen)
    return {
        "prev_pid": nullable(off["prev_pid"], seen, np.int32),
        "prev_comm": comm,
        "prev_run_ns": nullable(run, seen, np.int64),
    }
