"""GC passes of a process with no client, from CPython's USDT probes (bcc uprobes).

CPython built `--with-dtrace` (Debian's, Ubuntu's and Fedora's `python3`)
has the USDT markers `gc__start(generation)` and `gc__done(collected)`.
`follow(pid, run_id)` attaches `gc_usdt.c` to them for one process (the
daemon's `--pid`, or a pid `stallscope run --no-client` asked for through
service/watch.py), pairs start and done per thread in the kernel, and a
reader thread drains the ring buffers every `sched_poll_ms` into
`gc_events` rows of that run (`uncollectable` and `seq` NULL: the probes
do not carry them). The reader also waits on a pidfd per process, so the
moment a followed process exits (or hands over to a client) is passed to
`on_end(pid, run_id, ended_ns)`, which sets the run's `ended_ns`. `usdt_missing(pid)` says why a process cannot be
followed (an interpreter without the markers: pyenv and python.org builds).
Enabling the markers raises their semaphores (CPython skips a marker whose
semaphore is 0); bcc 0.26 does it by writing `/proc/PID/mem` (seen with
strace) for as long as its USDT context lives. That needs ptrace access to
the process: the same user, or CAP_SYS_PTRACE, which the service's unit
does not have (CAP_BPF CAP_PERFMON CAP_DAC_READ_SEARCH): the opt-in
drop-in `systemd/stallscope-usdt-gc.conf` adds exactly that one.
A process that connects a
probe client later is left to the client (its gc.callbacks see the same
passes) from the moment the daemon handles that connection; a pass that
falls between the client's start and that moment (well under 100 ms) is
stored in both runs. Never reads a Python object of the
traced process, never stops it.
"""

import ctypes
import logging
import os
import select
import threading
import time

from stallscope import threads
from stallscope.probes.base import Probe

log = logging.getLogger(__name__)

CAP_SYS_PTRACE = 19
CAP_PERFMON = 38
CAP_BPF = 39
DROP_IN = "systemd/stallscope-usdt-gc.conf"
BPF_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gc_usdt.c")
PROBE_NAMES = ("gc__start", "gc__done")


def _effective_caps():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def command_line(pid, proc_root="/proc"):
    """The process's argv from /proc (empty when it cannot be read)."""
    try:
        with open(f"{proc_root}/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _pidfd(pid):
    """A descriptor that becomes readable when `pid` exits (None when the
    kernel has no pidfd_open: the reader then checks /proc each poll)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class RECORD(ctypes.Structure):  # struct gc_record in gc_usdt.c
    _fields_ = [
        ("start_ns", ctypes.c_uint64),
        ("end_ns", ctypes.c_uint64),
        ("collected", ctypes.c_int64),
        ("tid", ctypes.c_uint32),
        ("generation", ctypes.c_int32),
    ]


class _Followed:
    __slots__ = ("pid", "run_id", "bpf", "usdt", "rows", "lost_seen", "callback", "pidfd")

    def __init__(self, pid, run_id, bpf):
        self.pid = pid
        self.run_id = run_id
        self.bpf = bpf
        self.pidfd = _pidfd(pid)
        self.rows = []  # (tid, generation, start_ns, end_ns, collected)
        self.lost_seen = 0
        self.callback = None  # the ring buffer's ctypes callback: kept alive here
        # bcc's USDT context: freeing it lowers the probes' semaphores again,
        # and CPython then skips the markers. Kept as long as we follow.
        self.usdt = None


class UsdtGcProbe(Probe):
    name = "gc"
    backend = "usdt"

    @classmethod
    def unavailable(cls, settings=None):
        caps = _effective_caps()
        if not (caps & (1 << CAP_BPF) and caps & (1 << CAP_PERFMON)) and os.geteuid() != 0:
            return "needs root or CAP_BPF+CAP_PERFMON: run the daemon as root or grant them"
        try:
            import bcc  # noqa: F401
        except ImportError:
            return (
                "bcc not installed: apt-get install python3-bpfcc, then scripts/bootstrap.sh "
                "links it into the venv"
            )
        return None

    def __init__(self, settings=None):
        super().__init__(settings)
        self.poll_s = float(self.settings.sched_poll_ms) / 1000.0
        self._followed = {}  # pid -> _Followed
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self.sink = None
        self.passes = 0
        # on_end(pid, run_id, ended_ns): the process exited or a client took over.
        self.on_end = None

    @staticmethod
    def usdt_missing(pid, proc_root="/proc"):
        """Why process `pid` has no usable gc markers, or None."""
        try:
            exe = os.readlink(f"{proc_root}/{pid}/exe")
        except OSError as exc:
            return f"cannot read {proc_root}/{pid}/exe: {exc.strerror}"
        from bcc import USDT

        try:
            names = {p.name.decode() for p in USDT(pid=pid).enumerate_probes()}
        except Exception as exc:  # bcc raises plain Exception for a vanished pid
            return f"cannot read the USDT notes of {exe}: {exc}"
        missing = [n for n in PROBE_NAMES if n not in names]
        if missing:
            return (
                f"{exe} has no USDT probe {', '.join(missing)} (CPython built without "
                "its dtrace markers, e.g. pyenv or python.org builds; Debian's and Ubuntu's "
                "/usr/bin/python3 have them): GC passes come only from a probe client"
            )
        try:
            os.close(os.open(f"{proc_root}/{pid}/mem", os.O_RDWR))
        except OSError as exc:
            return (
                f"cannot raise the markers' semaphores: writing {proc_root}/{pid}/mem "
                f"failed ({exc.strerror}); it needs ptrace access to the process (the same "
                f"user, or CAP_SYS_PTRACE: the drop-in {DROP_IN})"
            )
        return None

    def start(self, sink):
        self.sink = sink
        self._thread = threading.Thread(target=self._loop, name="gc-usdt", daemon=True)
        self._thread.start()

    def follow(self, pid, run_id):
        """Attach to `pid`'s gc markers, storing its passes under `run_id`."""
        from bcc import BPF, USDT

        usdt = USDT(pid=pid)
        usdt.enable_probe(probe="gc__start", fn_name="on_gc_start")
        usdt.enable_probe(probe="gc__done", fn_name="on_gc_done")
        cflags = ["-DMAX_THREADS=4096", "-DRING_PAGES=64"]
        bpf = BPF(src_file=BPF_SOURCE.encode(), usdt_contexts=[usdt], cflags=cflags)
        followed = _Followed(pid, run_id, bpf)
        followed.usdt = usdt

        def on_record(ctx, data, size, _f=followed):
            r = ctypes.cast(data, ctypes.POINTER(RECORD)).contents
            _f.rows.append((r.tid, r.generation, r.start_ns, r.end_ns, r.collected))

        followed.callback = on_record
        bpf["records"].open_ring_buffer(on_record)
        with self._lock:
            self._followed[pid] = followed
        log.info("gc probe: following pid %d (run %d) through USDT", pid, run_id)

    def track(self, pid):
        # A probe client of this process connected: its gc.callbacks record the
        # same passes, so stop here (each pass stored once).
        with self._lock:
            followed = self._followed.pop(pid, None)
        if followed is not None:
            self._drain(followed)
            self._release(followed, time.monotonic_ns())
            log.info("gc probe: pid %d connected a probe client; USDT stops", pid)
            if self.sink is not None:
                self.sink.status(
                    self.name,
                    self.backend,
                    "active",
                    f"pid {pid}: a probe client connected; its GC passes come from the client",
                )

    def _drain(self, followed):
        try:
            followed.bpf.ring_buffer_poll(0)
        except Exception as exc:
            log.warning("gc probe: reading pid %d failed: %s", followed.pid, exc)
        rows, followed.rows = followed.rows, []
        try:
            lost = int(followed.bpf["lost"][ctypes.c_int(0)].value)
        except Exception:
            lost = followed.lost_seen
        if lost > followed.lost_seen and self.sink is not None:
            now = time.monotonic_ns()
            self.sink.loss("gc_usdt", now, now, lost - followed.lost_seen, "ring_full")
            followed.lost_seen = lost
        if rows and self.sink is not None:
            self.passes += len(rows)
            tid, gen, start, end, collected = (list(c) for c in zip(*rows, strict=True))
            self.sink.append(
                "gc_events",
                {
                    "run_id": [followed.run_id] * len(rows),
                    "tid": tid,
                    "generation": gen,
                    "start_ns": start,
                    "end_ns": end,
                    "collected": collected,
                },
            )

    def _release(self, followed, ended_ns):
        try:
            followed.bpf.cleanup()
        except Exception as exc:
            log.warning("gc probe: detaching from pid %d failed: %s", followed.pid, exc)
        if followed.pidfd is not None:
            os.close(followed.pidfd)
            followed.pidfd = None
        if self.on_end is not None and ended_ns is not None:
            try:
                self.on_end(followed.pid, followed.run_id, ended_ns)
            except Exception:
                log.exception("bug: ending the run of pid %d failed", followed.pid)

    def _exited(self, followed, readable):
        if followed.pidfd is not None:
            return followed.pidfd in readable
        return not os.path.exists(f"/proc/{followed.pid}")

    def _loop(self):
        threads.background("gc-usdt")
        while not self._stop.is_set():
            with self._lock:
                followed = list(self._followed.values())
            fds = [f.pidfd for f in followed if f.pidfd is not None]
            # The wait is the poll interval, cut short by an exit: ended_ns is
            # the moment the kernel reported it, not the next tick.
            try:
                readable = set(select.select(fds, [], [], self.poll_s)[0]) if fds else set()
            except (OSError, ValueError):  # a descriptor closed by track() meanwhile
                readable = set()
            if not fds:
                self._stop.wait(self.poll_s)
            ended_ns = time.monotonic_ns()
            for f in followed:
                self._drain(f)
                if not self._exited(f, readable):
                    continue
                with self._lock:
                    if self._followed.get(f.pid) is not f:
                        continue  # track() took it meanwhile
                    del self._followed[f.pid]
                self._drain(f)
                self._release(f, ended_ns)
                log.info("gc probe: pid %d exited", f.pid)

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            followed, self._followed = list(self._followed.values()), {}
        for f in followed:
            self._drain(f)
            # Still running: the run ends with the daemon's coverage, not here.
            self._release(f, None)

    def status(self):
        return {"pids": sorted(self._followed), "passes": self.passes}
