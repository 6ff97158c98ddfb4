"""The daemon's own footprint: CPU time, resident memory, and CPU placement.

`cpu_seconds()`, `rss_bytes()` and `CpuPercent` read this process's counters
(every thread, as the kernel accounts them); `/metrics` and `stallscope status`
use the same readers, so they report the same figures. `SelfStats.tick()` is called from the
daemon's main loop and writes a `daemon_stats` row every `INTERVAL_S` and
whenever the set of traced processes changes; each row says whether the
daemon may run on a CPU that a traced process may run on too, because then
the tracer can preempt the engine it measures (attribution names it as the
preemptor like any other task). It only reads /proc and sched_getaffinity;
it never changes the placement itself. It also gives the daemon's threads
kernel names ('stallscope/...') so that a preemption by the tracer names it.
"""

import logging
import os
import threading
import time

from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

INTERVAL_S = 10.0
_PAGE = os.sysconf("SC_PAGE_SIZE")
ADVICE = (
    "pin the daemon away from the engine (systemd: CPUAffinity= on CPUs the "
    "engine does not use; or Nice=10 and CPUWeight=20): see docs/footprint.md"
)


def cpu_seconds():
    """CPU time this process has used so far (user + system, every thread), s."""
    t = os.times()
    return t.user + t.system


def rss_bytes(proc_root="/proc"):
    """Resident memory of this process now, bytes; None when /proc is unreadable."""
    try:
        with open(f"{proc_root}/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class CpuPercent:
    """CPU use between two calls of `sample()`, percent of one core (a busy
    thread on each of two cores reads 200)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._last = (time.monotonic(), cpu_seconds())

    def sample(self):
        """Percent since the previous call (or since construction); None when
        no time has passed."""
        now, cpu = time.monotonic(), cpu_seconds()
        with self._lock:
            then, cpu_then = self._last
            self._last = (now, cpu)
        if now <= then:
            return None
        return 100.0 * (cpu - cpu_then) / (now - then)


def peak_rss_bytes():
    """The highest resident memory of this process so far (VmHWM), bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def thread_comm(name):
    """The kernel name (comm, 15 bytes) for a daemon thread called `name`:
    'stallscope/' and the first letters of what it does, so that top -H,
    perf and the offcpu preemptor columns say the tracer took the CPU."""
    short = name.removeprefix("stallscope-").replace("_", "")
    return ("stallscope/" + short)[:15]


def name_threads(names_done=None):
    """Give the threads of this process kernel names (/proc/self/task/TID/comm):
    the main thread 'stallscope', Python threads 'stallscope/<what>', and
    native threads still carrying the interpreter's name (DuckDB's workers)
    'stallscope/db'; threads named by their library (gRPC) keep their name.
    Returns the thread ids handled."""
    done = set() if names_done is None else names_done
    main = threading.main_thread()
    python = {t.native_id: t for t in threading.enumerate() if t.native_id is not None}
    try:
        with open(f"/proc/self/task/{main.native_id}/comm") as f:
            inherited = {f.read().strip(), "stallscope"}
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return done
    for tid in tids:
        if tid in done:
            continue
        t = python.get(tid)
        if t is main:
            comm = "stallscope"
        elif t is not None:
            comm = thread_comm(t.name)
        else:
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    current = f.read().strip()
            except OSError:
                continue
            comm = "stallscope/db" if current in inherited else None
        if comm is not None:
            try:
                with open(f"/proc/self/task/{tid}/comm", "w") as f:
                    f.write(comm)
            except OSError:
                pass  # gone already, or procfs read-only: only a name is lost
        done.add(tid)
    return done


def cpu_list(cpus):
    """'0-3,6' for {0, 1, 2, 3, 6}."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def shared_cpus(pids, own=None):
    """{pid: CPUs it shares with this process} for each pid in `pids` allowed
    on a CPU this process is allowed on (a gone pid is left out)."""
    own = set(os.sched_getaffinity(0) if own is None else own)
    out = {}
    for pid in pids:
        try:
            common = own & set(os.sched_getaffinity(pid))
        except OSError:
            continue
        if common:
            out[pid] = common
    return out


class SelfStats:
    """Samples the daemon into `daemon_stats` (store.append)."""

    def __init__(self, store, interval_s=INTERVAL_S):
        self.store = store
        self.interval_s = interval_s
        self._last_s = time.monotonic()
        self._last_cpu_s = cpu_seconds()
        self._pids = frozenset()
        self._warned = set()
        self._named = set()
        self.last = None  # the latest row, as a dict

    def tick(self, tracked_pids, now_s=None):
        """Write a row when it is due or the traced processes changed."""
        now_s = time.monotonic() if now_s is None else now_s
        pids = frozenset(tracked_pids)
        if pids == self._pids and now_s - self._last_s < self.interval_s:
            return None
        self._pids = pids
        return self.sample(now_s)

    def sample(self, now_s=None):
        now_s = time.monotonic() if now_s is None else now_s
        name_threads(self._named)
        cpu_s = cpu_seconds()
        span_s = max(now_s - self._last_s, 1e-9)
        pct = 100.0 * (cpu_s - self._last_cpu_s) / span_s
        self._last_s, self._last_cpu_s = now_s, cpu_s
        own = os.sched_getaffinity(0)
        shared = shared_cpus(self._pids, own)
        warning = None
        if shared:
            where = cpu_list(set().union(*shared.values()))
            warning = (
                f"the daemon may run on CPUs {where} with traced pid(s) "
                f"{', '.join(str(p) for p in sorted(shared))}: it can preempt them; {ADVICE}"
            )
            new = set(shared) - self._warned
            if new:
                log.warning("%s", warning)
                self._warned |= new
        row = {
            "ts_ns": int(now_s * 1e9),
            "pid": os.getpid(),
            "cpu_ns": int(cpu_s * 1e9),
            "cpu_pct": pct,
            "rss_bytes": rss_bytes(),
            "peak_rss_bytes": peak_rss_bytes(),
            "cpus": cpu_list(own),
            "shared_pids": sorted(shared),
            "warning": warning,
        }
        self.last = row
        self.store.append("daemon_stats", {k: [v] for k, v in row.items()})
        return row
