"""Deep mode and diagnosis windows: when the expensive kernel probes run.

The syscall probe's tracepoints slow every syscall on the host, so it is
loaded at start but attached only in deep mode (`stallscope daemon --deep`:
for the daemon's whole life) or during a diagnosis window (`stallscope
deep --for 60s`, the API's StartDiagnosis): attached when the window opens,
detached when it ends, with coverage rows for exactly that time. A window
asked for while one runs extends it; windows are capped at MAX_WINDOW_S.
This module never blocks the daemon's loop beyond an attach or a detach.
"""

import logging
import threading
import time

from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

# probes attached only in deep mode or a window: syscalls (every syscall on
# the host gets slower), cuda (a trap per probed driver call, BENCHMARKS.md)
EXPENSIVE = ("syscalls", "cuda")
MAX_WINDOW_S = 3600.0


class DeepWindows:
    def __init__(self, probes, coverage, deep=False):
        self.probes = [p for p in probes if p.name in EXPENSIVE]
        self.coverage = coverage
        self.deep = deep
        self.until_ns = None  # end of the current window (monotonic ns)
        self.windows = 0
        self._lock = threading.Lock()
        if deep:
            self._attach()

    def start(self, duration_s):
        """Open (or extend) a window of `duration_s`; returns (until_ns, probe names).
        ValueError for a duration that is not positive; RuntimeError when no
        expensive probe could be loaded here."""
        if not duration_s > 0:
            raise ValueError(f"a diagnosis window needs a positive duration, not {duration_s}")
        if not self.probes:
            raise RuntimeError(
                "no expensive probe is loaded (the syscall and CUDA driver probes need "
                "bcc and root; see probe_status)"
            )
        duration_s = min(float(duration_s), MAX_WINDOW_S)
        with self._lock:
            until = time.monotonic_ns() + int(duration_s * 1e9)
            if self.deep:
                return None, [p.name for p in self.probes]
            if self.until_ns is None:
                self._attach()
                self.windows += 1
                log.info("diagnosis window opened for %.0f s", duration_s)
            self.until_ns = max(self.until_ns or 0, until)
            return self.until_ns, [p.name for p in self.probes]

    def tick(self, now_ns=None):
        """Close the window once its time is up (called from the daemon's loop)."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        with self._lock:
            if self.until_ns is None or now_ns < self.until_ns:
                return
            self.until_ns = None
            self._detach(now_ns)
            log.info("diagnosis window closed")

    def status(self):
        with self._lock:
            return {
                "deep": self.deep,
                "window_until_ns": self.until_ns,
                "windows": self.windows,
                "probes": [p.name for p in self.probes],
            }

    # A coverage row must hold every event the probe can have recorded: it
    # starts before the attach and ends after the detach has returned (an
    # event between the window's planned end and the detach is inside it).
    def _attach(self):
        for probe in self.probes:
            before_ns = time.monotonic_ns()
            try:
                probe.attach()
            except Exception as exc:
                log.error("%s probe could not attach: %s", probe.name, exc)
                continue
            self.coverage.probe_started(probe.name, before_ns)

    def _detach(self, now_ns=None):
        for probe in self.probes:
            try:
                probe.detach()
            except Exception as exc:
                log.error("%s probe could not detach: %s", probe.name, exc)
            self.coverage.probe_stopped(probe.name, max(now_ns or 0, time.monotonic_ns()))
