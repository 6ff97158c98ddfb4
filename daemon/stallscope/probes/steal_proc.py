"""Steal probe (/proc/stat): hypervisor steal time per CPU and interval.

Reads the per-CPU `steal` column of /proc/stat every `steal_poll_ms` (up to
`IDLE_MAX_S` apart while nothing is stolen) and
writes one `steal` row per CPU whose counter moved: [previous read, this
read] and the steal inside it in ns. The kernel keeps steal in ns from the
hypervisor's steal clock (CONFIG_PARAVIRT_TIME_ACCOUNTING) but /proc/stat
shows it in USER_HZ ticks (10 ms), so a row's steal_ns is exact up to one
tick at each end; rows are written only where steal happened, so inside
this probe's coverage a missing row means none. Host-wide: track() and
untrack() only say whether any process is followed; with none for
`base.PARK_AFTER_S` the reader sleeps until one is (the next row then spans
the pause, with its whole steal). It never blocks on anything but the
procfs read.
"""

import logging
import os
import threading
import time

import numpy as np

from stallscope import threads
from stallscope.probes.base import Probe, ReaderPark

log = logging.getLogger(__name__)

STEAL_FIELD = 8  # cpuN user nice system idle iowait irq softirq steal ...
# The longest wait between reads while nothing is stolen: 4 default periods,
# so the first row after a quiet stretch spans at most 0.4 s.
IDLE_MAX_S = 0.4


def read_steal_ticks(proc_root="/proc"):
    """{cpu: steal ticks} from /proc/stat's per-CPU lines."""
    out = {}
    with open(f"{proc_root}/stat") as f:
        for line in f:
            if not line.startswith("cpu") or line.startswith("cpu "):
                if out:
                    break  # per-CPU lines are contiguous
                continue
            parts = line.split()
            if len(parts) > STEAL_FIELD:
                out[int(parts[0][3:])] = int(parts[STEAL_FIELD])
    return out


class ProcStealProbe(Probe):
    name = "steal"
    backend = "proc"

    @classmethod
    def unavailable(cls, settings=None):
        root = (settings.proc_root if settings else None) or "/proc"
        try:
            ticks = read_steal_ticks(root)
        except OSError as exc:
            return f"cannot read {root}/stat ({exc.strerror}): mount procfs"
        if not ticks:
            return f"{root}/stat has no per-CPU steal column (kernel older than 2.6.11?)"
        return None

    def __init__(self, settings=None):
        super().__init__(settings)
        self.proc_root = self.settings.proc_root
        self.poll_s = self.settings.steal_poll_ms / 1000.0
        self.tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
        self._sink = None
        self._last = None  # (ts_ns, {cpu: ticks})
        self._stop = threading.Event()
        self._park = ReaderPark()  # no traced process: its rows would serve no step
        self._followed = set()
        self._thread = None
        self._lock = threading.Lock()
        self.rows = 0
        self.samples = 0

    def start(self, sink):
        if self._thread is not None:
            return
        self._sink = sink
        self.sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="stallscope-steal", daemon=True)
        self._thread.start()

    def _run(self):
        threads.background("steal")
        # While no CPU is stolen from, the wait doubles up to IDLE_MAX_S (the
        # row that ends a quiet stretch then starts where it began, with the
        # same total); any steal brings it back to steal_poll_ms.
        wait_s = self.poll_s
        while not self._park.wait(self._stop, wait_s):
            try:
                rows = self.sample()
            except Exception:
                log.exception("steal probe: sampling failed")
                rows = 0
            wait_s = self.poll_s if rows else min(wait_s * 2, max(IDLE_MAX_S, self.poll_s))

    def sample(self, now_ns=None):
        """Read /proc/stat once; write the steal since the previous read."""
        with self._lock:
            ticks = read_steal_ticks(self.proc_root)
            now_ns = time.monotonic_ns() if now_ns is None else now_ns
            self.samples += 1
            last, self._last = self._last, (now_ns, ticks)
            if last is None:
                return 0
            cpus = [c for c in sorted(ticks) if c in last[1] and ticks[c] > last[1][c]]
            if not cpus:
                return 0
            steal = np.array([ticks[c] - last[1][c] for c in cpus], dtype=np.int64)
            self._sink.append(
                "steal",
                {
                    "cpu": np.array(cpus, dtype=np.int16),
                    "start_ns": np.full(len(cpus), last[0], dtype=np.int64),
                    "end_ns": np.full(len(cpus), now_ns, dtype=np.int64),
                    "steal_ns": steal * self.tick_ns,
                },
            )
            self.rows += len(cpus)
            return len(cpus)

    def track(self, pid):
        self._followed.add(int(pid))
        self._park.followed(len(self._followed))

    def untrack(self, pid):
        self._followed.discard(int(pid))
        self._park.followed(len(self._followed))

    def stop(self):
        if self._thread is None:
            return
        self._stop.set()
        self._park.wake()
        self._thread.join()
        self._thread = None
        try:
            self.sample()
        except OSError:
            pass

    def covering(self):
        return self._thread is not None

    def detail(self):
        return (
            f"/proc/stat steal every {self.poll_s * 1000:.0f} ms, in "
            f"{self.tick_ns // 1_000_000} ms ticks"
        )

    def status(self):
        return {
            "backend": self.backend,
            "poll_ms": self.poll_s * 1000,
            "tick_ns": self.tick_ns,
            "samples": self.samples,
            "rows": self.rows,
        }
