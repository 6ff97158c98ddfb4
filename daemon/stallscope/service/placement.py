"""Keeps the daemon's threads off the CPUs its traced engines may run on.

An engine whose threads are pinned (a pinned step thread, vLLM's OpenMP
binding, a unit's CPUAffinity=) leaves the other CPUs to everything else:
there the daemon can never preempt it. `Placement.tick` reads the CPUs
every thread of every traced process may run on (each thread's own
affinity: torch and OpenMP pin threads one by one) and, when the daemon
is allowed on a CPU outside that set, moves every daemon thread there
(`threads.place`); when the engines may run everywhere the daemon is
allowed, it stays where it was allowed and relies on its threads' idle
priority (`stallscope.threads`). It re-reads on every change of the traced
processes and every `interval_s`, and never changes an engine's placement.
"""

import logging
import os
import time

from stallscope import threads
from stallscope.service.selfstats import cpu_list
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

INTERVAL_S = 5.0


def engine_cpus(pids, proc_root="/proc"):
    """Every CPU some thread of `pids` may run on (gone pids and threads are
    left out)."""
    cpus = set()
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"{proc_root}/{pid}/task")]
        except (OSError, ValueError):
            continue
        for tid in tids:
            try:
                cpus |= os.sched_getaffinity(tid)
            except OSError:
                continue
    return cpus


class Placement:
    def __init__(self, enabled=True, interval_s=INTERVAL_S):
        self.enabled = enabled
        self.interval_s = interval_s
        self._pids = frozenset()
        self._last_s = 0.0
        self.cpus = None  # where the daemon's threads are kept now (None: anywhere allowed)
        self.engine = set()  # CPUs the traced engines may run on, as last read

    def tick(self, tracked_pids, now_s=None):
        """Re-place when the traced processes changed or it is due."""
        if not self.enabled:
            return None
        now_s = time.monotonic() if now_s is None else now_s
        pids = frozenset(tracked_pids)
        if pids == self._pids and now_s - self._last_s < self.interval_s:
            return self.cpus
        self._pids, self._last_s = pids, now_s
        self.engine = engine_cpus(pids)
        allowed = threads.allowed()
        free = allowed - self.engine
        target = free if self.engine and free else None
        if target != self.cpus:
            problems = threads.place(target)
            if target:
                log.info(
                    "daemon threads kept on CPU(s) %s, off the traced engines' CPU(s) %s",
                    cpu_list(target),
                    cpu_list(self.engine & allowed),
                )
            else:
                log.info(
                    "daemon threads may use CPU(s) %s: the traced engines may run on all of them "
                    "(background work stays at idle priority)",
                    cpu_list(allowed),
                )
            for problem in problems[:3]:
                log.warning("placement: %s", problem)
            self.cpus = target
        return self.cpus
