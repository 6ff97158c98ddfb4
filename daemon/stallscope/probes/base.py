"""The small interface every probe backend implements, and what it writes to.

A backend is constructed with `ProbeSettings`, asked `unavailable()` (a
reason string with the fix, or None), then `start(sink)`-ed. The daemon
tells it which processes to follow with `track(pid)` / `untrack(pid)` as
probe clients connect and leave (and for `--pid`). It writes rows with
`sink.append(table, columns)` (column name -> numpy array or list, whole
batches, never a row at a time), known gaps with `sink.loss(...)` and
changes of its state with `sink.status(...)`.
`stop()` flushes what it holds and releases kernel or driver resources.
`covering()` says whether it records now (a detachable probe may be loaded
but detached); the daemon turns that into `coverage` rows per run.
"""

import threading
import time
from dataclasses import dataclass, field

from stallscope import gaps

# A reader with no process to follow keeps its cadence this long after the
# last one left (its late records, the kernel's per-thread tails, a process
# that reconnects), then parks; parked, it still looks once every
# PARK_CHECK_S. An idle daemon's four ring readers and its steal reader woke
# ~10 times a second for nothing (0.2-0.3 % of a core: bench/daemon_footprint.py).
PARK_AFTER_S = 10.0
PARK_CHECK_S = 10.0


def _key(default, doc, **declared):
    """A ProbeSettings field that is also the config key [probes] <field name>.

    `declared` may set `live` (changes on SIGHUP), `minimum`, `flag` (the
    argparse dest when it is not the field name), `env` and `metavar`."""
    return field(default=default, metadata={"doc": doc, **declared})


@dataclass
class ProbeSettings:
    """Every probe setting. Each field is a declared configuration key
    `probes.<field name>` with its flag (`--<field-name>`), environment
    variable (`STALLSCOPE_<FIELD_NAME>`), file key and this default:
    `service/config_keys.py` makes the keys from these fields, so a new
    setting is one field with `_key(default, doc)`, and tests fail on a field
    without one. A message that tells operators to change a setting names
    the field (tests/test_settings.py checks)."""

    proc_root: str = _key("/proc", "procfs root (tests point it at fixtures)")
    sched_poll_hz: float = _key(
        100.0,
        "/proc scheduling backend sampling rate, Hz",
        live=True,
        minimum=0.1,
        flag="proc_poll_hz",
    )
    gpu_poll_hz: float = _key(10.0, "NVML polling rate, Hz", live=True, minimum=0.1)
    gpus: tuple = _key((), "NVML device indices to sample; empty = all", metavar="N[,N...]")
    sched_poll_ms: float = _key(
        20.0, "bcc and perf backends: read the kernel's ring buffers this often, ms", minimum=1
    )
    sched_rescan_ms: float = _key(
        100.0, "perf backend: look for new threads of followed processes this often, ms", minimum=1
    )
    sched_verify_ms: float = _key(
        1000.0,
        "bcc backend: compare its switch counts with /proc's this often, ms",
        minimum=1,
    )
    sched_detail: bool = _key(
        False,
        "bcc backend: an exact row per switch for every thread; off: threads that emit no "
        "span (pool workers) are summarised in the kernel into sched_summary rows",
    )
    sched_gap_clock: bool = _key(
        True,
        "bcc backend: the daemon's periodic work waits for a moment a traced thread leaves "
        "its CPU idle (up to its period again, at most 0.5 s late) instead of waking on a "
        "timer while the engine runs",
    )
    sched_summary_ms: float = _key(
        50.0, "bcc backend: one sched_summary row per summarised thread this often, ms", minimum=1
    )
    sched_summary_after_ms: float = _key(
        1000.0,
        "bcc backend: summarise a thread once its process has run steps this long without it "
        "emitting a span, ms",
        minimum=0,
    )
    sched_max_tids: int = _key(
        65536, "bcc backend: threads followed at once (kernel map entries)", minimum=1
    )
    sched_max_tgids: int = _key(
        4096, "bcc backend: processes followed at once (kernel map entries)", minimum=1
    )
    sched_ring_pages: int = _key(
        1024,
        "bcc backend: kernel ring buffer size in pages, a power of two (1024 = 4 MiB, "
        "~0.4 s of 200k events/s)",
        minimum=1,
    )
    gpu_buffers: bool = _key(
        True, "read the driver's sample buffers (clocks, power) between NVML polls"
    )
    gpu_buffer_poll_s: float = _key(
        1.0, "read the driver's sample buffers this often, s", minimum=0.01
    )
    gpu_sync_s: float = _key(
        10.0, "re-measure the driver clock's offset at most this far apart, s", minimum=0.1
    )
    gpu_batch_s: float = _key(0.5, "hand GPU rows to the store this often, s", minimum=0.01)
    gpu_retry_s: float = _key(
        1.0, "look for a GPU that fell off the bus again this often, s", minimum=0
    )
    # kernel causes inside a step (docs/kernel-causes.md)
    kernel_causes: bool = _key(
        True, "page-fault, IRQ, steal and syscall probes (each where it can run)"
    )
    deep: bool = _key(
        False,
        "keep the expensive probes (syscalls: every syscall on the host gets slower) "
        "attached for the daemon's life, not only in `stallscope deep` windows",
    )
    syscall_threshold_us: float = _key(
        50.0,
        "syscalls at least this long (us) are rows of their own; shorter ones summed",
        minimum=1,
    )
    kernel_poll_ms: float = _key(
        20.0,
        "page-fault, IRQ and syscall probes: read their ring buffers this often, ms",
        minimum=1,
    )
    kernel_ring_pages: int = _key(
        256,
        "page-fault, IRQ and syscall probes: ring buffer size in pages each, a power of two",
        minimum=1,
    )
    kernel_max_tids: int = _key(
        16384, "page-fault and syscall probes: per-thread aggregates held at once", minimum=1
    )
    page_faults_flush_ms: float = _key(
        20.0, "a thread's page faults are one row per this much time, ms", minimum=1
    )
    page_fault_gap_us: float = _key(
        5000.0,
        "a page fault that maps no page (or on a kernel that refuses the mapping end) is "
        "timed to its thread's next fault when that is at most this much on-CPU time away "
        "(us); longer ones are priced at the mean of the measured ones",
        minimum=1,
    )
    page_fault_map_end: bool = _key(
        True,
        "time each page fault to its page's mapping (kmem:rss_stat: ~+0.5 us per page fault "
        "of every process on the host, BENCHMARKS.md); off: to the thread's next fault alone",
    )
    syscalls_flush_ms: float = _key(
        20.0,
        "a thread's short calls of one syscall are one row per this much time, ms",
        minimum=1,
    )
    steal_poll_ms: float = _key(100.0, "read /proc/stat's steal time this often, ms", minimum=1)
    # the CUDA driver probe: host time in libcuda (docs/cuda-probe.md)
    cuda_driver: bool = _key(
        True,
        "CUDA driver probe: uprobes on libcuda's launch, sync, query and copy entry points "
        "of traced processes, attached in diagnosis windows (bcc; needs root)",
    )
    cuda_library: str = _key(
        "libcuda.so",
        "CUDA driver probe: file name (prefix) of the driver library looked for in a traced "
        "process's /proc/PID/maps",
    )
    cuda_threshold_us: float = _key(
        50.0,
        "CUDA driver probe: driver calls at least this long (us) are rows of their own; "
        "shorter ones summed",
        minimum=1,
    )
    cuda_flush_ms: float = _key(
        20.0,
        "CUDA driver probe: a thread's short calls of one kind are one row per this, ms",
        minimum=1,
    )
    cuda_poll_gap_us: float = _key(
        10000.0,
        "CUDA driver probe: a polling loop (cuEventQuery/cuStreamQuery until done) ends when "
        "two queries are further apart than this, us",
        minimum=1,
    )
    cuda_rescan_ms: float = _key(
        250.0,
        "CUDA driver probe: look for the driver in traced processes that do not map it yet "
        "(a library dlopen'ed later) this often, ms",
        minimum=1,
    )
    # where traced processes ran and what shared their CPUs (docs/placement.md)
    placement: bool = _key(
        True,
        "placement probe: each traced process's CPUs (time per CPU), how busy their SMT "
        "siblings were, NUMA nodes, CPU clock, affinity, cgroup CPU limit and hash seed (/proc, /sys)",
    )
    placement_poll_ms: float = _key(
        1000.0,
        "placement probe: read each traced thread's CPU and CPU time this often, ms",
        minimum=10,
    )
    placement_window_s: float = _key(
        5.0,
        "placement probe: one placement_cpu row per process and CPU this often, s",
        minimum=0.01,
    )
    sys_root: str = _key("/sys", "sysfs root (tests point it at fixtures)")
    # the CPU sampler: Python stacks of tracked threads on CPU (docs/cpu-sampler.md)
    cpu_sampler: bool = _key(
        True,
        "sample what tracked threads run on CPU: Python frames and the native leaf "
        "(bcc, a cpu-clock perf event; needs CAP_BPF+CAP_PERFMON)",
    )
    cpu_sample_hz: float = _key(
        1000.0,
        "CPU sampler: samples per second of each tracked thread while on CPU (clock 'timer')",
        minimum=1,
    )
    cpu_sample_clock: str = _key(
        "auto",
        "CPU sampler: 'timer' (a cpu-clock perf event at cpu_sample_hz: an interrupt of its "
        "own, a tenth of a torch engine's step at 1 kHz on a VM), 'tick' (the scheduler's tick, "
        "CONFIG_HZ: no interrupt of its own, a quarter of the samples at HZ 250), or 'auto' "
        "(the timer's cost measured at start, ~0.3 s at idle priority: the tick where the "
        "timer costs a busy thread over 2 percent of its CPU)",
        choices=("auto", "timer", "tick"),
    )
    cpu_max_depth: int = _key(
        64,
        "CPU sampler: Python frames kept per sample, the innermost (deeper stacks are cut "
        "and counted; the BPF program's load time grows with it: 64 ~3.5 s, at most 192)",
        minimum=1,
    )
    cpu_ring_pages: int = _key(
        2048,
        "CPU sampler: sample ring buffer size in pages, a power of two (2048 = 8 MiB, ~7,800 "
        "samples: 40 busy threads at 1 kHz between two reads)",
        minimum=1,
    )
    cpu_poll_ms: float = _key(
        200.0,
        "CPU sampler: read its ring buffers this often while samples come, ms (each read "
        "costs the daemon ~1 ms whatever it holds)",
        minimum=1,
    )


def periodic_wait(event, wait_s):
    """A reader's wait between two reads: until `event` is set (a stop, a
    filling ring), else the first moment after `wait_s` a traced thread
    leaves its CPU idle, so the read does not take a busy engine's CPU
    (gaps.py), at most `gaps.late_by(wait_s)` (`wait_s` while someone
    watches the live stream). `event` is cleared when it ended the wait."""
    from stallscope.probes.bpf_common import LIVE  # numpy: not at import

    hard_s = wait_s if LIVE.is_set() else gaps.late_by(wait_s)
    if gaps.wait(wait_s, hard_s, event.set, event.wait):
        event.clear()


class ReaderPark:
    """The wait of a probe's reader thread, which sleeps while no process is
    followed: its kernel program filters on the followed processes (or, for
    steal, its rows only matter to their steps), so nothing it could read
    matters then. The probe calls `followed(n)` from track()/untrack() with
    how many processes it follows, and `wake()` after setting its stop
    event."""

    def __init__(self):
        self._event = threading.Event()
        self._empty_since = time.monotonic()  # None while something is followed

    def followed(self, n):
        if n:
            self._empty_since = None
            self._event.set()
        elif self._empty_since is None:
            self._empty_since = time.monotonic()

    def wake(self):
        self._event.set()

    def hurry(self):
        """Cut the reader's current wait short (its ring is filling)."""
        self._event.set()

    @property
    def parked(self):
        since = self._empty_since
        return since is not None and time.monotonic() - since >= PARK_AFTER_S

    def wait(self, stop, wait_s):
        """Sleep `wait_s` (or until `stop` is set or hurry() is called), or while parked until a
        process is followed again, `stop` is set or PARK_CHECK_S passed.
        Returns whether `stop` is set, like `stop.wait()`."""
        if not self.parked:
            # wake() (after stop is set), hurry() and followed() end the wait
            periodic_wait(self._event, wait_s)
            return stop.is_set()
        self._event.clear()
        if self._empty_since is not None and not stop.is_set():
            self._event.wait(PARK_CHECK_S)  # followed() and wake() set it
        return stop.is_set()


class Sink:
    """What a probe writes into; the daemon's implementation wraps the Store."""

    def append(self, table, columns):
        raise NotImplementedError

    def loss(self, probe, start_ns, end_ns, count, reason):
        raise NotImplementedError

    def status(self, probe, backend, state, detail):
        """A probe's state changed ('active', 'degraded', 'failed', ...)."""


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
