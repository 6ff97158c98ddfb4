"""eBPF scheduling probe (bcc): event-exact off-CPU, run-queue and migration rows.

Loads `sched_bcc.c` (tracepoints sched_switch, sched_wakeup, sched_wakeup_new,
sched_migrate_task, task_newtask, sched_process_exit), filtered in the kernel
to the tgids given to `track()`, paired in the kernel per thread, and reads
the BPF ring buffer itself: the ring is mmapped and drained by one reader
thread every `sched_poll_ms` as a numpy structured array, so the cost per
event in user space is a vector slice, not a Python callback. Timestamps are
`bpf_ktime_get_ns()`, i.e. CLOCK_MONOTONIC, the clock of `time.monotonic_ns()`.
It must never read a `task_struct` field (headers may not match the running
kernel) and never call into Python per event.
"""

import logging
import mmap
import os
import struct
import threading
import time

import numpy as np

from stallscope.probes.base import Probe

log = logging.getLogger("stallscope.probes.sched_bcc")

TRACEFS = "/sys/kernel/tracing"
BPF_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sched_bcc.c")
PAGE_SIZE = mmap.PAGESIZE

KIND_SWITCH_IN = 1
KIND_MIGRATE = 2
CNT_RESERVE_FAILED = 0
CNT_STATE_FULL = 1
CNT_LOST_IN_PREEMPTED = 2
CNT_LOST_IN_VOLUNTARY = 3

# `struct record` in sched_bcc.c, preceded by the ring buffer's 8-byte header.
RECORD_DTYPE = np.dtype(
    [
        ("hdr_len", "<u4"),
        ("hdr_pgoff", "<u4"),
        ("a_ns", "<u8"),
        ("b_ns", "<u8"),
        ("c_ns", "<u8"),
        ("pid", "<u4"),
        ("tid", "<u4"),
        ("cpu_a", "<u2"),
        ("cpu_b", "<u2"),
        ("kind", "u1"),
        ("preempted", "u1"),
        ("pad", "<u2"),
    ]
)
RECORD_LEN = RECORD_DTYPE.itemsize - 8  # what the program reserves
RINGBUF_BUSY_BIT = 1 << 31
RINGBUF_DISCARD_BIT = 1 << 30

CAP_PERFMON = 38
CAP_BPF = 39
CAP_SYS_ADMIN = 21


def _effective_caps():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def _has_bpf_privileges():
    caps = _effective_caps()
    if os.geteuid() == 0 and caps & (1 << CAP_SYS_ADMIN):
        return True
    return bool(caps & (1 << CAP_BPF)) and bool(caps & (1 << CAP_PERFMON))


class BccSchedProbe(Probe):
    """Kernel scheduling events of tracked processes through eBPF (bcc)."""

    name = "sched"
    backend = "bcc"

    @classmethod
    def unavailable(cls, settings=None):
        if not _has_bpf_privileges():
            return (
                "needs root or CAP_BPF+CAP_PERFMON (plus CAP_DAC_READ_SEARCH "
                "for tracefs): run the daemon as root or grant them in its unit"
            )
        try:
            import bcc  # noqa: F401
        except ImportError:
            return (
                "bcc not installed: apt-get install python3-bpfcc, then "
                "scripts/bootstrap.sh links it into the venv"
            )
        if not os.path.exists(f"{TRACEFS}/events/sched/sched_switch/format"):
            return f"tracefs not mounted at {TRACEFS}: mount -t tracefs tracefs {TRACEFS}"
        if not os.path.exists(f"{TRACEFS}/events/task/task_newtask/format"):
            return "kernel lacks the task:task_newtask tracepoint (needs Linux >= 3.9)"
        release = os.uname().release
        if not os.path.exists(f"/lib/modules/{release}/build/include"):
            return (
                f"kernel headers missing: apt-get install linux-headers-{release} "
                f"(or scripts/bootstrap.sh links the nearest headers as "
                f"/lib/modules/{release}/build)"
            )
        return None

    def __init__(self, settings=None):
        super().__init__(settings)
        self.max_tids = int(self.settings.sched_max_tids)
        self.max_tgids = int(self.settings.sched_max_tgids)
        # ring size in pages, a power of two; 4 MiB holds ~87k records, i.e.
        # 0.4 s of 200k events/s between two polls.
        self.ring_pages = int(self.settings.sched_ring_pages)
        self.poll_s = self.settings.sched_poll_ms / 1000.0
        self.proc_root = self.settings.proc_root
        self._bpf = None
        self._sink = None
        self._lock = threading.Lock()  # one drainer at a time
        self._stop = threading.Event()
        self._thread = None
        self._tracked = set()
        self._records = 0
        self._rows = {"offcpu": 0, "runq": 0, "migrations": 0}
        self._lost_seen = [0, 0, 0, 0, 0]
        self._lost_since_ns = time.monotonic_ns()
        self._reader_cpu_ns = 0
        self._drains = 0
        self._started_ns = 0
        self._data = None
        self.verify_s = self.settings.sched_verify_ms / 1000.0
        self._verify_base = {}  # (pid, tid) -> (proc_vol, proc_inv, bpf_vol, bpf_inv)
        self._unseen = {}  # tid -> [vol, inv] switch-outs the kernel made, we did not see
        self._last_verify = 0.0

    # -- lifecycle -------------------------------------------------------------

    def start(self, sink):
        from bcc import BPF

        if self._bpf is not None:
            return
        pages = self.ring_pages
        if pages & (pages - 1):
            raise ValueError(f"sched_ring_pages must be a power of two, not {pages}")
        cflags = [
            f"-DMAX_TIDS={self.max_tids}",
            f"-DMAX_TGIDS={self.max_tgids}",
            f"-DRINGBUF_PAGES={pages}",
        ]
        self._bpf = BPF(src_file=BPF_SOURCE.encode(), cflags=cflags)
        self._sink = sink
        self._map_ring(self._bpf[b"events"].map_fd, pages * PAGE_SIZE)
        self._counter_map = mmap.mmap(
            self._bpf[b"counters"].map_fd, PAGE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ
        )
        self._counter_view = np.frombuffer(self._counter_map, dtype=np.uint64, count=8)
        self._started_ns = time.monotonic_ns()
        self._lost_since_ns = self._started_ns
        for pid in list(self._tracked):
            self._load_tracked(pid)
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._reader, name="stallscope-sched-bcc", daemon=True
        )
        self._thread.start()
        log.info(
            "sched probe: bcc backend loaded (ring %d KiB, poll %.0f ms)",
            pages * PAGE_SIZE // 1024,
            self.poll_s * 1000,
        )

    def stop(self):
        if self._bpf is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.drain()
        self._check_losses()
        self._unmap_ring()
        self._bpf.cleanup()
        self._bpf = None

    # -- who is followed -------------------------------------------------------

    def track(self, pid):
        pid = int(pid)
        self._tracked.add(pid)
        if self._bpf is not None:
            self._load_tracked(pid)

    def _load_tracked(self, pid):
        import ctypes as ct

        # Mark the tgid first: from then on task_newtask records new threads,
        # so the /proc scan below cannot miss one created in between.
        self._bpf[b"tracked"][ct.c_uint32(pid)] = ct.c_uint8(1)
        tid_map = self._bpf[b"tid_tgid"]
        try:
            tids = os.listdir(f"{self.proc_root}/{pid}/task")
        except OSError:
            log.info("sched probe: process %d is gone; tracking it anyway", pid)
            return
        for tid in tids:
            tid_map[ct.c_uint32(int(tid))] = ct.c_uint32(pid)

    def untrack(self, pid):
        import ctypes as ct

        pid = int(pid)
        self._tracked.discard(pid)
        with self._lock:
            for key in [k for k in self._verify_base if k[0] == pid]:
                del self._verify_base[key]
        if self._bpf is None:
            return
        try:
            del self._bpf[b"tracked"][ct.c_uint32(pid)]
        except KeyError:
            pass
        for name in ("tid_tgid", "state"):
            table = self._bpf[name.encode()]
            stale = [
                k for k, v in table.items() if (v.value if name == "tid_tgid" else v.pid) == pid
            ]
            for k in stale:
                try:
                    del table[k]
                except KeyError:
                    pass

    # -- reading the ring ------------------------------------------------------

    def _map_ring(self, fd, data_size):
        # Layout of a BPF ring buffer map (kernel/bpf/ringbuf.c): page 0 is the
        # consumer position (ours to write), page 1 the producer position, then
        # the data area mapped twice in a row so a record that wraps around
        # reads as one contiguous slice.
        self._data_size = data_size
        self._mask = data_size - 1
        self._cons_map = mmap.mmap(
            fd, PAGE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0
        )
        self._prod_map = mmap.mmap(
            fd, PAGE_SIZE + 2 * data_size, mmap.MAP_SHARED, mmap.PROT_READ, offset=PAGE_SIZE
        )
        self._data = np.frombuffer(self._prod_map, dtype=np.uint8)

    def _unmap_ring(self):
        self._data = None
        self._counter_view = None
        for m in (self._cons_map, self._prod_map, self._counter_map):
            m.close()

    def _reader(self):
        t_cpu = time.thread_time_ns()
        while not self._stop.wait(self.poll_s):
            try:
                self.drain()
                self._check_losses()
                if time.monotonic() - self._last_verify >= self.verify_s:
                    self.verify()
            except Exception:  # a failing sink must not kill the reader
                log.exception("sched probe: reader error")
            now_cpu = time.thread_time_ns()
            self._reader_cpu_ns += now_cpu - t_cpu
            t_cpu = now_cpu

    def drain(self):
        """Decode and hand to the sink everything committed so far; returns records."""
        with self._lock:
            if self._bpf is None and self._data is None:
                return 0
            total = 0
            while True:
                n = self._drain_once()
                total += n
                if n == 0:
                    break
            self._drains += 1
            return total

    def _drain_once(self):
        cons = struct.unpack_from("<Q", self._cons_map, 0)[0]
        prod = struct.unpack_from("<Q", self._prod_map, 0)[0]
        avail = prod - cons
        if avail <= 0:
            return 0
        avail = min(avail, self._data_size)
        n = avail // RECORD_DTYPE.itemsize
        if n == 0:
            return 0
        start = PAGE_SIZE + (cons & self._mask)
        raw = np.frombuffer(self._data, dtype=RECORD_DTYPE, count=n, offset=start)
        hdr = raw["hdr_len"]
        busy = np.flatnonzero(hdr & RINGBUF_BUSY_BIT)
        if busy.size:
            n = int(busy[0])
            if n == 0:
                return 0
        # copy before releasing the space back to the kernel
        recs = raw[:n].copy()
        lens = recs["hdr_len"] & ~np.uint32(RINGBUF_BUSY_BIT | RINGBUF_DISCARD_BIT)
        if np.any(lens != RECORD_LEN):
            # Only our program writes this ring, always RECORD_LEN bytes.
            raise RuntimeError("sched ring buffer holds a record of unexpected size")
        struct.pack_into("<Q", self._cons_map, 0, cons + n * RECORD_DTYPE.itemsize)
        keep = (recs["hdr_len"] & np.uint32(RINGBUF_DISCARD_BIT)) == 0
        if not keep.all():
            recs = recs[keep]
        self._records += len(recs)
        self._emit(recs)
        return n

    def _emit(self, recs):
        sink = self._sink
        sw = recs[recs["kind"] == KIND_SWITCH_IN]
        if len(sw):
            off = sw[sw["a_ns"] != 0]
            if len(off):
                sink.append(
                    "offcpu",
                    {
                        "pid": off["pid"].astype(np.int32),
                        "tid": off["tid"].astype(np.int32),
                        "start_ns": off["a_ns"].astype(np.int64),
                        "end_ns": off["c_ns"].astype(np.int64),
                        "preempted": off["preempted"].astype(bool),
                        "cpu": off["cpu_a"].astype(np.int16),
                    },
                )
                self._rows["offcpu"] += len(off)
            rq = sw[sw["b_ns"] != 0]
            if len(rq):
                sink.append(
                    "runq",
                    {
                        "pid": rq["pid"].astype(np.int32),
                        "tid": rq["tid"].astype(np.int32),
                        "start_ns": rq["b_ns"].astype(np.int64),
                        "end_ns": rq["c_ns"].astype(np.int64),
                        "cpu": rq["cpu_b"].astype(np.int16),
                    },
                )
                self._rows["runq"] += len(rq)
        mig = recs[recs["kind"] == KIND_MIGRATE]
        if len(mig):
            sink.append(
                "migrations",
                {
                    "pid": mig["pid"].astype(np.int32),
                    "tid": mig["tid"].astype(np.int32),
                    "ts_ns": mig["a_ns"].astype(np.int64),
                    "from_cpu": mig["cpu_a"].astype(np.int16),
                    "to_cpu": mig["cpu_b"].astype(np.int16),
                },
            )
            self._rows["migrations"] += len(mig)

    def _counters(self):
        c = self._counter_view
        return [
            int(c[i])
            for i in (
                CNT_RESERVE_FAILED,
                CNT_STATE_FULL,
                CNT_LOST_IN_PREEMPTED,
                CNT_LOST_IN_VOLUNTARY,
            )
        ]

    def program_stats(self):
        """Per program: run_cnt, run_time_ns (both 0 unless sysctl
        kernel.bpf_stats_enabled=1) and recursion_misses (runs the kernel
        skipped because another BPF program was running on that CPU)."""
        out = {}
        for name, fn in self._bpf.funcs.items():
            stats = {}
            try:
                with open(f"/proc/self/fdinfo/{fn.fd}") as f:
                    for line in f:
                        key, _, value = line.partition(":")
                        if key in ("run_cnt", "run_time_ns", "recursion_misses"):
                            stats[key] = int(value)
            except OSError:
                continue
            short = name.decode().rsplit("__", 1)[-1]
            out[short] = stats
        return out

    def _check_losses(self):
        if self._bpf is None:
            return
        now = time.monotonic_ns()
        counts = self._counters()
        counts.append(sum(s.get("recursion_misses", 0) for s in self.program_stats().values()))
        reasons = (
            "ring buffer full: records dropped in the kernel "
            "(raise sched_ring_pages or lower sched_poll_ms)",
            "per-thread state map full: intervals lost (raise sched_max_tids)",
            "switch-in not reported by the kernel: one preempted off-CPU interval lost",
            "switch-in not reported by the kernel: one blocked off-CPU interval lost",
            "tracepoint runs skipped by the kernel while another BPF program "
            "ran on the CPU: events of unknown kind lost",
        )
        for i, reason in enumerate(reasons):
            delta = counts[i] - self._lost_seen[i]
            if delta > 0:
                self._sink.loss("sched", self._lost_since_ns, now, int(delta), reason)
                self._lost_seen[i] = counts[i]
        self._lost_since_ns = now

    def verify(self):
        """Compare per-thread switch-out counts seen in BPF with the kernel's.

        The kernel can skip a tracepoint's BPF program without counting a
        miss (e.g. perf's recursion guard while other tracing runs on the
        CPU); nvcsw/nivcsw in /proc status count every switch. A deficit
        is written as a loss and kept per thread in status()["unseen"].
        Returns the switch-outs found missing in this pass."""
        with self._lock:
            return self._verify()

    def _verify(self):
        import ctypes as ct

        self._last_verify = time.monotonic()
        if self._bpf is None:
            return 0
        state = self._bpf[b"state"]
        now = time.monotonic_ns()
        found = 0
        for pid in list(self._tracked):
            try:
                tids = [int(t) for t in os.listdir(f"{self.proc_root}/{pid}/task")]
            except OSError:
                continue
            for gone in [k for k in self._verify_base if k[0] == pid and k[1] not in tids]:
                del self._verify_base[gone]
            for tid in tids:
                key = ct.c_uint32(tid)
                try:
                    a = state[key]
                    with open(f"{self.proc_root}/{pid}/task/{tid}/status", "rb") as f:
                        text = f.read()
                    b = state[key]
                except (KeyError, OSError):
                    continue
                if (a.n_vol, a.n_inv) != (b.n_vol, b.n_inv):
                    continue  # it switched meanwhile: next pass
                vol = int(text.split(b"\nvoluntary_ctxt_switches:")[1].split()[0])
                inv = int(text.split(b"nonvoluntary_ctxt_switches:")[1].split()[0])
                base = self._verify_base.get((pid, tid))
                self._verify_base[(pid, tid)] = (vol, inv, b.n_vol, b.n_inv)
                if base is None:
                    continue
                miss_v = (vol - base[0]) - ((b.n_vol - base[2]) & 0xFFFFFFFF)
                miss_i = (inv - base[1]) - ((b.n_inv - base[3]) & 0xFFFFFFFF)
                for i, miss, kind in ((0, miss_v, "voluntary"), (1, miss_i, "preempted")):
                    if miss > 0:
                        self._unseen.setdefault(tid, [0, 0])[i] += miss
                        found += miss
                        self._sink.loss(
                            "sched",
                            now,
                            now,
                            int(miss),
                            f"{kind} switch-outs of tid {tid} the kernel made but "
                            f"the tracepoint did not report (dropped by the kernel)",
                        )
        return found

    def status(self):
        return {
            "backend": self.backend,
            "resolution_ns": 0,  # event-exact
            "tracked": sorted(self._tracked),
            "records": self._records,
            "rows": dict(self._rows),
            "lost_reserve": self._lost_seen[0],
            "lost_state_full": self._lost_seen[1],
            "lost_switch_in": (self._lost_seen[2], self._lost_seen[3]),  # preempted, voluntary
            "lost_recursion": self._lost_seen[4],
            "reader_cpu_ns": self._reader_cpu_ns,
            "drains": self._drains,
            "unseen": {tid: tuple(v) for tid, v in self._unseen.items()},
            "poll_ms": self.poll_s * 1000,
            "ring_bytes": self.ring_pages * PAGE_SIZE,
        }
