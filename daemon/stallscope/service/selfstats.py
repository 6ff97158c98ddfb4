"""The daemon's own footprint: CPU seconds, CPU percent and resident memory.

Read from the kernel's accounting of this process (`os.times()` and
`/proc/self/statm`), so `/metrics` and `stallscope status` report the same
figures the same way. Cheap enough to call on every scrape (two small
reads, no subprocess). It must never raise: a figure it cannot read is None.
"""

import os
import threading
import time

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def cpu_seconds():
    """User + system CPU time of this process (all threads), seconds."""
    t = os.times()
    return t.user + t.system


def rss_bytes(proc_root="/proc"):
    """Resident set size of this process, bytes; None when /proc is unreadable."""
    try:
        with open(f"{proc_root}/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
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
