"""Placement probe (/proc, /sys): where each traced process ran, and what shared it.

For every followed process it records (schema 155, docs/placement.md) a
`placement` row at tracking start and whenever one of these changes: the
CPU affinity (`Cpus_allowed_list`), the cgroup v2 CPU limit (`cpu.max`,
`cpuset.cpus.effective`), the hash seed (`PYTHONHASHSEED` from
/proc/PID/environ, 'random' when unset) and, on a host with more than one
NUMA node, the node holding most of its resident pages (/proc/PID/numa_maps,
read once a minute: it walks the page tables). Every `placement_poll_ms` it
reads each thread's on-CPU time (schedstat, ns) and the CPU it is on (stat
field 39), and /proc/stat's per-CPU busy time: a thread's CPU time of an
interval is given to the CPU it was on at the interval's end (exact for a
thread that stayed on one CPU, as pinned and most engine threads do), and
multiplied by how busy that CPU's SMT siblings were in the interval. Per
process and CPU, one `placement_cpu` row per `placement_window_s` holds the
sums and the mean cpufreq clock. A field the host cannot give (no SMT
sibling, one NUMA node, no cpufreq, an unreadable environ) is NULL and
`reasons` says why. Only procfs and sysfs reads: it never stops or traces
the process.
"""

import collections
import logging
import os
import threading
import time

import numpy as np

from stallscope import threads
from stallscope.probes.base import Probe

log = logging.getLogger(__name__)

NUMA_EVERY_S = 60.0  # numa_maps walks the process's page tables: rarely
CGROUP_EVERY_S = 10.0
BUSY_SKIP = (3, 4)  # /proc/stat: idle and iowait are not busy


def parse_cpu_list(text):
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]; '' -> []."""
    out = []
    for part in (text or "").strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


class Topology:
    """SMT siblings, NUMA nodes and cpufreq files of the host, from sysfs."""

    def __init__(self, sys_root="/sys"):
        self.sys_root = sys_root
        base = f"{sys_root}/devices/system/cpu"
        self.siblings, self.node, self.freq_path = {}, {}, {}
        try:
            names = os.listdir(base)
        except OSError:
            names = []
        for name in names:
            if not (name.startswith("cpu") and name[3:].isdigit()):
                continue
            cpu = int(name[3:])
            sib = parse_cpu_list(_read(f"{base}/{name}/topology/thread_siblings_list") or "")
            self.siblings[cpu] = [c for c in sib if c != cpu]
            path = f"{base}/{name}/cpufreq/scaling_cur_freq"
            if os.path.exists(path):
                self.freq_path[cpu] = path
        self.nodes = []
        try:
            nodes = os.listdir(f"{sys_root}/devices/system/node")
        except OSError:
            nodes = []
        for name in sorted(nodes):
            if name.startswith("node") and name[4:].isdigit():
                n = int(name[4:])
                self.nodes.append(n)
                for cpu in parse_cpu_list(_read(f"{sys_root}/devices/system/node/{name}/cpulist")):
                    self.node[cpu] = n

    @property
    def smt(self):
        return any(self.siblings.values())

    @property
    def numa(self):
        return len(self.nodes) > 1

    def khz(self, cpu):
        path = self.freq_path.get(cpu)
        text = _read(path) if path else None
        return int(text) if text and text.strip().isdigit() else None

    def reasons(self):
        out = []
        if not self.siblings:
            out.append(f"no CPUs under {self.sys_root}/devices/system/cpu")
        elif not self.smt:
            out.append("no SMT: no CPU has a sibling thread")
        if not self.numa:
            out.append(f"one NUMA node ({len(self.nodes) or 'no node directory'})")
        if not self.freq_path:
            out.append("no cpufreq: the CPU clock is not readable")
        return out


def read_cpu_busy(proc_root="/proc"):
    """{cpu: busy ticks} (all /proc/stat columns but idle and iowait)."""
    out = {}
    text = _read(f"{proc_root}/stat") or ""
    for line in text.splitlines():
        if line.startswith("cpu") and not line.startswith("cpu "):
            parts = line.split()
            vals = [int(v) for v in parts[1:]]
            # guest time is already in user (and guest_nice in nice)
            out[int(parts[0][3:])] = sum(v for i, v in enumerate(vals[:8]) if i not in BUSY_SKIP)
    return out


def _read_bytes(path):
    # os.read, not open(): a poll reads two small files per thread, and the
    # file object's set-up is most of the cost of such a read
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_threads(proc_root, pid, prev=None):
    """{tid: (on-CPU ns, cpu)} of the process's threads; {} when it is gone.
    A thread whose on-CPU time has not moved since `prev` keeps its CPU
    there: its stat (the CPU it is on) is read only when it ran."""
    out = {}
    prev = prev or {}
    try:
        tids = os.listdir(f"{proc_root}/{pid}/task")
    except OSError:
        return out
    for t in tids:
        tid = int(t)
        base = f"{proc_root}/{pid}/task/{t}"
        sched = _read_bytes(f"{base}/schedstat")
        if not sched:
            continue
        try:
            ns = int(sched.split()[0])
        except (ValueError, IndexError):
            continue
        if tid in prev and prev[tid][0] == ns:
            out[tid] = prev[tid]
            continue
        stat = _read_bytes(f"{base}/stat")
        try:
            fields = stat[stat.rindex(b")") + 2 :].split()
            out[tid] = (ns, int(fields[36]))  # field 39: processor
        except (TypeError, ValueError, IndexError):
            continue
    return out


def read_static(proc_root, sys_root, pid, topo, with_numa):
    """What the process may run on: affinity, cgroup limits, hash seed and
    (with_numa) the NUMA node of its memory. Missing parts are None, with
    the reason in 'reasons'."""
    reasons = []
    out = {"affinity": None, "affinity_cpus": None, "cgroup": None, "cgroup_cpus": None,
           "cgroup_cpuset": None, "hash_seed": None, "mem_node": None, "mem_nodes": None}  # fmt: skip
    status = _read(f"{proc_root}/{pid}/status")
    if status is None:
        return None  # gone
    for line in status.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            out["affinity"] = line.split(":", 1)[1].strip()
            out["affinity_cpus"] = len(parse_cpu_list(out["affinity"]))
    cg = _read(f"{proc_root}/{pid}/cgroup")
    path = None
    for line in (cg or "").splitlines():
        if line.startswith("0::"):
            path = line[3:].strip()
    if path is None:
        reasons.append("no cgroup v2 path")
    else:
        out["cgroup"] = path
        base = f"{sys_root}/fs/cgroup{path.rstrip('/')}"
        cpu_max = _read(f"{base}/cpu.max")
        if cpu_max is None:
            reasons.append("no cpu.max in its cgroup")
        else:
            quota, _, period = cpu_max.strip().partition(" ")
            if quota != "max" and period:
                out["cgroup_cpus"] = round(int(quota) / int(period), 3)
        cpuset = _read(f"{base}/cpuset.cpus.effective")
        out["cgroup_cpuset"] = cpuset.strip() if cpuset and cpuset.strip() else None
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
        seed = next((e[15:] for e in env if e.startswith(b"PYTHONHASHSEED=")), None)
        out["hash_seed"] = (
            "random" if seed in (None, b"", b"random") else seed.decode(errors="replace")
        )
    except OSError as exc:
        reasons.append(f"environ unreadable ({exc.strerror}): hash seed unknown")
    if with_numa:
        maps = _read(f"{proc_root}/{pid}/numa_maps")
        if maps is None:
            reasons.append("numa_maps unreadable: memory node unknown")
        else:
            pages = {}
            for tok in maps.split():
                if tok[:1] == "N" and "=" in tok and tok[1:].split("=")[0].isdigit():
                    n, _, v = tok[1:].partition("=")
                    pages[int(n)] = pages.get(int(n), 0) + int(v)
            if pages:
                out["mem_nodes"] = ",".join(f"N{n}={pages[n]}" for n in sorted(pages))
                out["mem_node"] = max(pages, key=lambda n: (pages[n], -n))
    out["reasons"] = reasons
    return out


class _Tracked:
    """One followed process: its last thread times, window sums, last row."""

    def __init__(self, pid):
        self.pid = pid
        self.threads = None  # {tid: (ns, cpu)} at the last poll
        self.window = {}  # cpu -> [oncpu_ns, sibling_busy_ns or None, khz sum, khz n]
        self.window_start = None
        self.static = None  # the last row's fields
        self.numa_at = self.cgroup_at = -1e18


class ProcPlacementProbe(Probe):
    name = "placement"
    backend = "proc"

    @classmethod
    def unavailable(cls, settings=None):
        root = (settings.proc_root if settings else None) or "/proc"
        if not read_cpu_busy(root):
            return f"cannot read per-CPU times from {root}/stat: mount procfs"
        return None

    def __init__(self, settings=None):
        super().__init__(settings)
        self.proc_root = self.settings.proc_root
        self.sys_root = self.settings.sys_root
        self.poll_s = self.settings.placement_poll_ms / 1000.0
        self.window_ns = int(self.settings.placement_window_s * 1e9)
        self.tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
        self.topo = Topology(self.sys_root)
        self._sink = None
        self._pids = {}
        self._pending = collections.deque()  # (track?, pid, ns) from track()/untrack()
        self._busy = None  # (ts_ns, {cpu: ticks})
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = None
        self.polls = 0
        self.rows = 0

    # ----- life --------------------------------------------------------------
    def start(self, sink):
        if self._thread is not None:
            return
        self._sink = sink
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="stallscope-place", daemon=True)
        self._thread.start()

    def _run(self):
        threads.background("placement")
        while not self._stop.is_set():
            if not self._pids and not self._pending:  # nothing followed: no wake-ups until track()
                self._wake.wait()
                self._wake.clear()
                continue
            if self._stop.wait(self.poll_s):
                break
            try:
                self.poll()
            except Exception:
                log.exception("placement probe: poll failed")

    def stop(self):
        if self._thread is None:
            return
        self._stop.set()
        self._wake.set()
        self._thread.join()
        self._thread = None
        with self._lock:
            self._apply_pending()
            for t in list(self._pids.values()):
                self._flush(t, time.monotonic_ns())

    # track() and untrack() come from the daemon's ingest thread: they only
    # queue the change (the probe's own thread runs at idle priority and may
    # hold the lock for long on a busy machine; the caller must not wait).
    def track(self, pid):
        self._pending.append((True, pid, time.monotonic_ns()))
        self._wake.set()

    def untrack(self, pid):
        self._pending.append((False, pid, time.monotonic_ns()))
        self._wake.set()

    def settle(self):
        """Apply the queued track/untrack calls now (the poll does it first)."""
        with self._lock:
            self._apply_pending()

    def _apply_pending(self):
        while self._pending:
            add, pid, ts = self._pending.popleft()
            if add and pid not in self._pids:
                t = self._pids[pid] = _Tracked(pid)
                self._observe_static(t, ts)
                t.threads = read_threads(self.proc_root, pid)
            elif not add and pid in self._pids:
                self._flush(self._pids.pop(pid), ts)

    def covering(self):
        return self._thread is not None

    def detail(self):
        return f"/proc every {self.poll_s * 1000:.0f} ms; " + (
            "; ".join(self.topo.reasons()) or "SMT, NUMA and cpufreq readable"
        )

    def status(self):
        return {"backend": self.backend, "poll_ms": self.poll_s * 1000, "polls": self.polls,
                "rows": self.rows, "followed": len(self._pids)}  # fmt: skip

    # ----- reads -------------------------------------------------------------
    def poll(self, now_ns=None):
        """One round: per-CPU busy time, every followed thread's CPU time,
        the static fields when due; rows for windows that ended."""
        with self._lock:
            self._apply_pending()
            now_ns = time.monotonic_ns() if now_ns is None else now_ns
            self.polls += 1
            busy = read_cpu_busy(self.proc_root)
            last, self._busy = self._busy, (now_ns, busy)
            frac = {}
            if last is not None and now_ns > last[0]:
                span = (now_ns - last[0]) / self.tick_ns  # ticks per CPU in the interval
                frac = {c: min(1.0, max(0.0, (busy[c] - last[1].get(c, busy[c])) / span))
                        for c in busy}  # fmt: skip
            for t in list(self._pids.values()):
                self._poll_one(t, now_ns, frac)

    def _poll_one(self, t, now_ns, frac):
        if now_ns - t.cgroup_at >= CGROUP_EVERY_S * 1e9:
            self._observe_static(t, now_ns)
        prev = t.threads or {}
        cur = t.threads = read_threads(self.proc_root, t.pid, prev)
        if t.window_start is None:
            t.window_start = now_ns
        for tid, (ns, cpu) in cur.items():
            d = ns - prev[tid][0] if tid in prev else 0
            if d <= 0:
                continue
            w = t.window.setdefault(cpu, [0, None, 0, 0])
            w[0] += d
            sib = self.topo.siblings.get(cpu)
            if sib and frac:
                w[1] = (w[1] or 0) + d * max(frac.get(c, 0.0) for c in sib)
        for cpu, w in t.window.items():
            khz = self.topo.khz(cpu)
            if khz is not None:
                w[2] += khz
                w[3] += 1
        if now_ns - t.window_start >= self.window_ns:
            self._flush(t, now_ns)

    def _observe_static(self, t, now_ns):
        numa_due = self.topo.numa and now_ns - t.numa_at >= NUMA_EVERY_S * 1e9
        s = read_static(self.proc_root, self.sys_root, t.pid, self.topo, numa_due)
        t.cgroup_at = now_ns
        if s is None:
            return
        if numa_due:
            t.numa_at = now_ns
        elif t.static is not None:  # keep the last memory node between reads
            s["mem_node"], s["mem_nodes"] = t.static["mem_node"], t.static["mem_nodes"]
        s["reasons"] = "; ".join(self.topo.reasons() + s["reasons"]) or None
        if s == t.static:
            return
        t.static = s
        cols = {
            "pid": np.array([t.pid], dtype=np.int32),
            "ts_ns": np.array([now_ns], dtype=np.int64),
        }
        for k, v in s.items():
            cols[k] = [v]
        self._sink.append("placement", cols)
        self.rows += 1

    def _flush(self, t, now_ns):
        used = sorted(c for c, w in t.window.items() if w[0] > 0)
        if used and t.window_start is not None:
            n = len(used)
            w = t.window
            self._sink.append(
                "placement_cpu",
                {
                    "pid": np.full(n, t.pid, dtype=np.int32),
                    "cpu": np.array(used, dtype=np.int16),
                    "start_ns": np.full(n, t.window_start, dtype=np.int64),
                    "end_ns": np.full(n, now_ns, dtype=np.int64),
                    "oncpu_ns": np.array([w[c][0] for c in used], dtype=np.int64),
                    "sibling_busy_ns": [None if w[c][1] is None else int(w[c][1]) for c in used],
                    "node": [self.topo.node.get(c) for c in used],
                    "khz": [round(w[c][2] / w[c][3]) if w[c][3] else None for c in used],
                },
            )
            self.rows += n
        t.window = {}
        t.window_start = now_ns
