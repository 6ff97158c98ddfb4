"""Which threads the bcc scheduling probe summarises, and their `sched_summary` rows.

A torch engine's OpenMP worker switches thousands of times a second and
never runs a step: an exact row per switch costs the daemon more than the
engine's own steps. So, unless `sched_detail` is set, a thread of a traced
process is summarised in the kernel (`summarised` map -> a slot of the
mmapped `summaries` array, sched_bcc.c) once its process has run steps for
`sched_summary_after_ms` and the thread has emitted no span meanwhile; the
threads that emit spans (the daemon learns them from the client's markers)
always keep event-exact rows, and a summarised thread that starts emitting
spans gets them back. The kernel only adds to a slot; every
`sched_summary_ms` the reader takes the differences since its last read
and writes one row per thread that did anything: on-CPU, off-CPU,
preempted and run-queue time, switch, preemption and migration counts.
Totals are exact (each interval is counted once, in the row of the read
that follows its end); the time resolution is the read interval. A
thread's first row starts at the read that summarised it (its slot counted
nothing before), never at the read before. Never
issues a map syscall per read (they make the kernel skip tracepoint runs
on that CPU): only when a thread changes side.
"""

import ctypes as ct
import logging
import mmap

import numpy as np

from stallscope.probes import bpf_common

log = logging.getLogger(__name__)

FIELDS = (
    "tid", "oncpu_ns", "offcpu_ns", "preempted_ns", "runq_ns", "switches",
    "preemptions", "migrations", "in_ns",
)  # fmt: skip
SUMS = FIELDS[1:-1]


class ThreadSummaries:
    """The summarised threads of one loaded program (the probe's lock held by callers)."""

    def __init__(self, bpf, max_slots, after_ns, interval_ns):
        self.after_ns = int(after_ns)
        self.interval_ns = int(interval_ns)
        self.max_slots = int(max_slots)
        table = bpf[b"summaries"]
        self.dtype = bpf_common.struct_dtype(table.Leaf)
        bpf_common.require_fields(self.dtype, FIELDS, "sched_bcc.h struct summary")
        for name in self.dtype.names:
            if self.dtype.fields[name][0] != np.dtype("<u8"):
                raise bpf_common.LayoutError(f"summary field {name} must be a u64")
        stride = (self.dtype.itemsize + 7) & ~7  # BPF arrays round values up to 8 bytes
        size = max(1, stride * self.max_slots)
        size = (size + bpf_common.PAGE_SIZE - 1) // bpf_common.PAGE_SIZE * bpf_common.PAGE_SIZE
        self._mmap = mmap.mmap(table.map_fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        view_dtype = np.dtype(
            {
                "names": list(self.dtype.names),
                "formats": [self.dtype.fields[n][0] for n in self.dtype.names],
                "offsets": [self.dtype.fields[n][1] for n in self.dtype.names],
                "itemsize": stride,
            }
        )
        self._view = np.frombuffer(self._mmap, dtype=view_dtype, count=self.max_slots)
        self._map = bpf[b"summarised"]
        self._free = list(range(self.max_slots - 1, -1, -1))
        self.slots = {}  # tid -> (pid, slot)
        self._base = {}  # slot -> totals (SUMS) at the last read
        # slot -> when those totals were taken: a row starts there, not at
        # the last read, so a slot given at a read (before which it counted
        # nothing) never dates its first switches back to the read before
        self._since = {}
        self.first_seen = {}  # (pid, tid) -> first exact record's time, ns
        self.steps_since = {}  # pid -> when its first span thread was seen, ns
        self.step_tids = set()  # (pid, tid) that emitted spans
        self.full_logged = False
        self._pending = []  # final rows of threads released between reads
        self.last_read_ns = 0
        self.rows = 0

    def close(self):
        self._view = None
        self._mmap.close()

    # ----- who is summarised ------------------------------------------------------
    def seen(self, pids, tids, now_ns):
        """Threads met in exact records (what may be summarised later)."""
        keys = np.unique((pids.astype(np.uint64) << np.uint64(32)) | tids.astype(np.uint64))
        for key in keys.tolist():
            self.first_seen.setdefault((key >> 32, key & 0xFFFFFFFF), now_ns)

    def step_threads(self, pid, tids, now_ns):
        """`tids` of `pid` emitted spans: exact rows for them, from now on."""
        self.steps_since.setdefault(pid, now_ns)
        for tid in tids:
            self.step_tids.add((pid, tid))
            if tid in self.slots:
                self._release(tid, now_ns, "emits spans")

    def forget(self, pid, now_ns):
        """Process `pid` is no longer followed."""
        for tid in [t for t, (p, _) in self.slots.items() if p == pid]:
            self._release(tid, now_ns, None)
        self.steps_since.pop(pid, None)
        self.step_tids = {k for k in self.step_tids if k[0] != pid}
        self.first_seen = {k: v for k, v in self.first_seen.items() if k[0] != pid}

    def _assign(self, now_ns):
        for (pid, tid), first in list(self.first_seen.items()):
            since = self.steps_since.get(pid)
            if since is None or (pid, tid) in self.step_tids or tid in self.slots:
                continue
            if now_ns - max(first, since) < self.after_ns:
                continue
            if not self._free:
                if not self.full_logged:
                    log.info("sched probe: %d threads summarised: the rest keep exact rows",
                             self.max_slots)  # fmt: skip
                    self.full_logged = True
                return
            slot = self._free.pop()
            self._base[slot] = self._totals(slot)
            self._since[slot] = now_ns
            try:
                self._map[ct.c_uint32(tid)] = ct.c_uint32(slot)
            except Exception as exc:  # the map is full or the thread is gone
                log.debug("sched probe: cannot summarise tid %d: %s", tid, exc)
                self._free.append(slot)
                continue
            self.slots[tid] = (pid, slot)
            del self.first_seen[(pid, tid)]

    def _release(self, tid, now_ns, why):
        pid, slot = self.slots.pop(tid)
        try:
            del self._map[ct.c_uint32(tid)]
        except KeyError:
            pass  # the thread exited: the kernel removed it
        self._pending.append(self._row(pid, tid, slot, now_ns))
        del self._base[slot]
        del self._since[slot]
        self._free.append(slot)
        if why:
            log.info("sched probe: tid %d of pid %d %s: exact rows again", tid, pid, why)
        self.first_seen.pop((pid, tid), None)

    # ----- rows --------------------------------------------------------------------
    def _totals(self, slot):
        v = self._view[slot]
        return tuple(int(v[name]) for name in SUMS)

    def _row(self, pid, tid, slot, now_ns):
        now = self._totals(slot)
        base = self._base[slot]
        self._base[slot] = now
        since = self._since[slot]
        self._since[slot] = now_ns
        return (pid, tid, since, now_ns) + tuple(n - b for n, b in zip(now, base, strict=True))

    def due(self, now_ns):
        return now_ns - self.last_read_ns >= self.interval_ns

    def read(self, now_ns, alive):
        """Rows since the last read (a dict of columns, or None); `alive(pid,
        tid)` says whether a summarised thread still exists."""
        self._assign(now_ns)
        rows = []
        for tid, (pid, slot) in list(self.slots.items()):
            if self._since[slot] >= now_ns:
                continue  # given at this read: what it counted since goes in the next row
            if alive(pid, tid):
                rows.append(self._row(pid, tid, slot, now_ns))
            else:
                self._release(tid, now_ns, None)  # its last row goes to _pending
        rows, self._pending = self._pending + rows, []
        self.last_read_ns = now_ns
        rows = [r for r in rows if any(r[4:])]
        if not rows:
            return None
        self.rows += len(rows)
        cols = list(zip(*rows, strict=True))
        names = ("pid", "tid", "start_ns", "end_ns") + SUMS
        types = (np.int32, np.int32) + (np.int64,) * (len(names) - 2)
        return {n: np.asarray(c, dtype=t) for n, c, t in zip(names, cols, types, strict=True)}
