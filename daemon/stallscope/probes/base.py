"""The small interface every probe backend implements, and what it writes to.

A backend is constructed with `ProbeSettings`, asked `unavailable()` (a
reason string with the fix, or None), then `start(sink)`-ed. The daemon
tells it which processes to follow with `track(pid)` / `untrack(pid)` as
probe clients connect and leave (and for `--pid`). It writes rows with
`sink.append(table, columns)` (column name -> numpy array or list, whole
batches, never a row at a time) and known gaps with `sink.loss(...)`.
`stop()` flushes what it holds and releases kernel or driver resources.
`covering()` says whether it records now (a detachable probe may be loaded
but detached); the daemon turns that into `coverage` rows per run.
"""

from dataclasses import dataclass, field


@dataclass
class ProbeSettings:
    proc_root: str = "/proc"  # procfs root (tests point it at fixtures)
    sched_poll_hz: float = 100.0  # /proc backend sampling rate
    gpu_poll_hz: float = 10.0  # NVML polling rate
    gpus: tuple = ()  # NVML indices to sample; empty = all
    kernel_causes: bool = True  # page-fault, IRQ, steal (and syscall) probes
    deep: bool = False  # expensive probes (syscalls) attached for the daemon's life
    syscall_threshold_us: float = 50.0  # syscalls at least this long are rows of their own
    extra: dict = field(default_factory=dict)


class Sink:
    """What a probe writes into; the daemon's implementation wraps the Store."""

    def append(self, table, columns):
        raise NotImplementedError

    def loss(self, probe, start_ns, end_ns, count, reason):
        raise NotImplementedError


class Probe:
    """Base class: subclasses set `name` ('sched', 'gpu') and `backend`."""

    name = "?"
    backend = "?"

    def __init__(self, settings=None):
        self.settings = settings or ProbeSettings()

    @classmethod
    def unavailable(cls, settings=None):
        """None when usable here, else why not and how to fix it."""
        return None

    def start(self, sink):
        raise NotImplementedError

    def track(self, pid):
        """Follow every thread of process `pid` (present and future)."""

    def untrack(self, pid):
        """Stop following `pid`."""

    def stop(self):
        """Flush what is held and release resources; idempotent."""

    def covering(self):
        """True while this probe records what it measures for the processes
        it follows (the daemon writes `coverage` rows from this)."""
        return True

    def status(self):
        """A small dict for GetStatus: counters, rates, settings."""
        return {}
