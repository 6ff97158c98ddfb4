"""/proc scheduling probe (last resort, unprivileged): per-thread counters sampled at sched_poll_hz.

Every 1/sched_poll_hz seconds one thread reads, for each thread of each
tracked process, `task/TID/schedstat` (on-CPU and run-queue wait ns,
timeslices), `status` (voluntary / nonvoluntary switches), `sched`
(se.nr_migrations) and `stat` (last CPU) through descriptors kept open
across polls, and writes one row per thread and window into offcpu, runq
and migrations holding that window's counter deltas, with `resolution_ns`
set to the window length. Totals are exact; where in the window an event
happened, and how long each single interval was, it cannot say, and it must
never pretend to: its rows carry the window as start/end and the counts in
`events`, `preempted_events`, `offcpu_ns`, `wait_ns`. Needs no privilege
beyond reading the traced process's /proc entries (same user or
CAP_SYS_PTRACE).
"""

import logging
import os
import threading
import time

import numpy as np

try:  # typed NULL columns; without pyarrow they stay lists
    import pyarrow as pa
except ImportError:  # pragma: no cover
    pa = None

from stallscope import threads
from stallscope.probes.base import Probe

log = logging.getLogger(__name__)

FILES = ("schedstat", "status", "sched", "stat")


def _parse(raw):
    """Counters of one thread from the four files' bytes, or None if it is gone."""
    schedstat, status, sched, stat = raw
    run_ns, wait_ns, slices = (int(x) for x in schedstat.split()[:3])
    vol = invol = 0
    for line in status.splitlines():
        if line.startswith(b"voluntary_ctxt_switches:"):
            vol = int(line.split()[1])
        elif line.startswith(b"nonvoluntary_ctxt_switches:"):
            invol = int(line.split()[1])
    nr_mig = 0
    at = sched.find(b"se.nr_migrations")
    if at >= 0:
        nr_mig = int(sched[at : sched.index(b"\n", at)].split(b":")[1])
    # field 39 (processor), counted after the ")" that ends comm
    cpu = int(stat.rsplit(b")", 1)[1].split()[36])
    return run_ns, wait_ns, slices, vol, invol, nr_mig, cpu


# Same column types as the exact backends' batches, so a store can merge
# them; columns that may hold None stay lists (NULL in the table).
_DTYPES = {
    "pid": np.int32,
    "tid": np.int32,
    "start_ns": np.int64,
    "end_ns": np.int64,
    "ts_ns": np.int64,
    "cpu": np.int16,
    "resolution_ns": np.int64,
    "events": np.int32,
    "preempted_events": np.int32,
    "offcpu_ns": np.int64,
    "wait_ns": np.int64,
}


_NULLABLE = {"preempted": "bool_", "from_cpu": "int16", "to_cpu": "int16"}


def _typed(cols):
    out = {}
    for k, v in cols.items():
        if k in _DTYPES:
            out[k] = np.asarray(v, dtype=_DTYPES[k])
        elif k in _NULLABLE and pa is not None:
            out[k] = pa.array(v, type=getattr(pa, _NULLABLE[k])())
        else:
            out[k] = v
    return out


class _Thread:
    __slots__ = ("fds", "last", "last_ns")

    def __init__(self, fds):
        self.fds = fds
        self.last = None
        self.last_ns = 0


class ProcSchedProbe(Probe):
    """Scheduling counters of tracked processes from /proc, at sched_poll_hz."""

    name = "sched"
    backend = "proc"

    @classmethod
    def unavailable(cls, settings=None):
        root = settings.proc_root if settings else "/proc"
        if not os.path.exists(f"{root}/self/task/{os.getpid()}/schedstat") and not os.path.exists(
            f"{root}/{os.getpid()}/task/{os.getpid()}/schedstat"
        ):
            return (
                f"no per-thread schedstat under {root}: the kernel needs "
                f"CONFIG_SCHEDSTATS / CONFIG_SCHED_INFO, or mount proc at {root}"
            )
        return None

    def __init__(self, settings=None):
        super().__init__(settings)
        self.proc_root = self.settings.proc_root
        self.poll_hz = float(self.settings.sched_poll_hz)
        self.period_ns = int(1e9 / self.poll_hz)
        self._tracked = {}  # pid -> {tid: _Thread}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._sink = None
        self._polls = 0
        self._poll_cpu_ns = 0
        self._rows = {"offcpu": 0, "runq": 0, "migrations": 0}

    def start(self, sink):
        self._sink = sink
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="stallscope-sched-proc", daemon=True)
        self._thread.start()
        log.info(
            "sched probe: /proc backend at %.0f Hz (resolution %.1f ms)",
            self.poll_hz,
            self.period_ns / 1e6,
        )

    def stop(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._sink is not None:
            self.drain()
        with self._lock:
            for threads in self._tracked.values():
                for t in threads.values():
                    self._close(t)
            self._tracked.clear()

    def track(self, pid):
        with self._lock:
            self._tracked.setdefault(int(pid), {})
            self._scan(int(pid))

    def untrack(self, pid):
        with self._lock:
            for t in self._tracked.pop(int(pid), {}).values():
                self._close(t)

    def drain(self):
        """Take one sample now (closing the current window); returns rows written."""
        return self._poll()

    # -- sampling --------------------------------------------------------------

    @staticmethod
    def _close(t):
        for fd in t.fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def _scan(self, pid):
        """Open descriptors for threads of `pid` not seen yet (threads born since)."""
        threads = self._tracked[pid]
        try:
            tids = [int(x) for x in os.listdir(f"{self.proc_root}/{pid}/task")]
        except OSError:
            return
        for tid in tids:
            if tid in threads:
                continue
            base = f"{self.proc_root}/{pid}/task/{tid}"
            fds = []
            try:
                for name in FILES:
                    fds.append(os.open(f"{base}/{name}", os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                for fd in fds:
                    os.close(fd)
                continue
            t = _Thread(fds)
            try:
                t.last = _parse([os.pread(fd, 4096, 0) for fd in fds])
                t.last_ns = time.monotonic_ns()
            except (OSError, ValueError, IndexError):
                self._close(t)
                continue
            threads[tid] = t

    def _run(self):
        threads.background("sched-proc")
        next_ns = time.monotonic_ns()
        while not self._stop.is_set():
            next_ns += self.period_ns
            c0 = time.thread_time_ns()
            try:
                self._poll()
            except Exception:
                log.exception("sched probe: /proc poll failed")
            self._poll_cpu_ns += time.thread_time_ns() - c0
            delay = (next_ns - time.monotonic_ns()) / 1e9
            if delay < 0:  # fell behind: do not burst to catch up
                next_ns = time.monotonic_ns()
                delay = 0
            self._stop.wait(delay)

    def _poll(self):
        cols = {t: {} for t in ("offcpu", "runq", "migrations")}

        def add(table, **row):
            for k, v in row.items():
                cols[table].setdefault(k, []).append(v)

        with self._lock:
            self._polls += 1
            for pid, threads in self._tracked.items():
                self._scan(pid)
                gone = []
                for tid, t in threads.items():
                    try:
                        raw = [os.pread(fd, 4096, 0) for fd in t.fds]
                        now_ns = time.monotonic_ns()
                        cur = _parse(raw)
                    except (OSError, ValueError, IndexError):
                        gone.append(tid)  # thread exited
                        continue
                    run0, wait0, sl0, vol0, inv0, mig0, cpu0 = t.last
                    run1, wait1, sl1, vol1, inv1, mig1, cpu1 = cur
                    start_ns, end_ns = t.last_ns, now_ns
                    window_ns = end_ns - start_ns
                    n_vol, n_inv = vol1 - vol0, inv1 - inv0
                    if n_vol or n_inv:
                        add(
                            "offcpu",
                            pid=pid,
                            tid=tid,
                            start_ns=start_ns,
                            end_ns=end_ns,
                            preempted=None,
                            cpu=cpu0,
                            resolution_ns=window_ns,
                            events=n_vol + n_inv,
                            preempted_events=n_inv,
                            offcpu_ns=max(0, window_ns - (run1 - run0)),
                        )
                    if wait1 != wait0:
                        add(
                            "runq",
                            pid=pid,
                            tid=tid,
                            start_ns=start_ns,
                            end_ns=end_ns,
                            cpu=cpu1,
                            resolution_ns=window_ns,
                            events=sl1 - sl0,
                            wait_ns=wait1 - wait0,
                        )
                    if mig1 != mig0:
                        # Only the last CPU of each sample is known: the path in
                        # between is not, so from/to stay NULL when they agree.
                        same = cpu0 == cpu1
                        add(
                            "migrations",
                            pid=pid,
                            tid=tid,
                            ts_ns=end_ns,
                            from_cpu=None if same else cpu0,
                            to_cpu=None if same else cpu1,
                            resolution_ns=window_ns,
                            events=mig1 - mig0,
                        )
                    t.last, t.last_ns = cur, now_ns
                for tid in gone:
                    self._close(threads.pop(tid))
        rows = 0
        for table, c in cols.items():
            if c:
                self._sink.append(table, _typed(c))
                n = len(c["tid"])
                self._rows[table] += n
                rows += n
        return rows

    def status(self):
        return {
            "backend": self.backend,
            "resolution_ns": self.period_ns,
            "poll_hz": self.poll_hz,
            "tracked": sorted(self._tracked),
            "threads": sum(len(t) for t in self._tracked.values()),
            "polls": self._polls,
            "poll_cpu_ns": self._poll_cpu_ns,
            "rows": dict(self._rows),
        }
