"""The gap clock's reader: the sched program's kicks, turned into wake-ups.

The sched program (sched_bcc.c) writes one kick to its `gap_kicks` ring when
a traced thread leaves its CPU idle at or after the time in `gap_due`, then
sets that time to never. `GapClock` keeps the waiters of `stallscope.gaps`,
writes the earliest one's time into `gap_due` (an mmapped array, no bpf()
syscall), and runs the one thread that waits on the ring's fd: a kick wakes
every waiter due within `gaps.COALESCE_S`, and the next due time is written.
The sched probe makes one per loaded program and installs it with
`gaps.install()`.
"""

import itertools
import mmap
import os
import select
import struct
import threading
import time

from stallscope import gaps, threads
from stallscope.probes.bpf_common import RingReader

NEVER = (1 << 64) - 1


class GapClock:
    """The waiters and the kick reader of one loaded sched program (`bpf`,
    a bcc BPF object holding `gap_due` and `gap_kicks`)."""

    def __init__(self, bpf):
        due_fd = bpf[b"gap_due"].map_fd
        # BPF_F_MMAPABLE: the due time is written without a bpf() syscall (a
        # map syscall makes the CPU skip tracepoint programs meanwhile).
        self._due = mmap.mmap(
            due_fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
        )
        # The kicks carry nothing but their arrival: read by skipping them.
        self._kicks = RingReader(bpf, "gap_kicks", None, pages=1)
        self._lock = threading.Lock()
        self._waiters = {}  # token -> (due_ns, wake)
        self._tokens = itertools.count()
        self._armed = NEVER
        self._stop_r, self._stop_w = os.pipe()
        self._closed = False
        self.kicks = 0  # kicks read
        self.woken = 0  # waiters woken by a kick
        self.asked = 0  # waits that asked for a gap
        self._write_due(NEVER)
        self._kicks.skip()
        self._thread = threading.Thread(target=self._run, name="stallscope-gaps", daemon=True)
        self._thread.start()

    # -- waiters ---------------------------------------------------------------

    def arm(self, due_ns, wake):
        """Wake `wake()` at the first gap at or after `due_ns` (monotonic);
        returns a token for disarm()."""
        with self._lock:
            token = next(self._tokens)
            self._waiters[token] = (due_ns, wake)
            self.asked += 1
            if self._closed:
                wake()
            elif due_ns < self._armed:
                self._armed = due_ns
                self._write_due(due_ns)
        return token

    def disarm(self, token):
        """Forget a waiter (woken or not); the kernel's due time follows the
        earliest one left, so a kick for nobody wakes nothing."""
        with self._lock:
            if self._waiters.pop(token, None) is not None and not self._closed:
                self._rearm()

    def _rearm(self):
        due = min((d for d, _ in self._waiters.values()), default=NEVER)
        if due != self._armed:
            self._armed = due
            self._write_due(due)

    def _write_due(self, due_ns):
        struct.pack_into("<Q", self._due, 0, due_ns)

    # -- kicks -----------------------------------------------------------------

    def _run(self):
        threads.background("gaps")
        while True:
            try:
                ready, _, _ = select.select([self._kicks.fd, self._stop_r], [], [])
            except (OSError, ValueError):
                return
            if self._stop_r in ready or self._closed:
                return
            if not self._kicks.skip():
                continue
            now = time.monotonic_ns()
            with self._lock:
                self.kicks += 1
                # The kernel set its due time to never at the kick.
                self._armed = NEVER
                horizon = now + int(gaps.COALESCE_S * 1e9)
                due = [t for t, (d, _) in self._waiters.items() if d <= horizon]
                wakes = [self._waiters.pop(t)[1] for t in due]
                self._rearm()
                self.woken += len(wakes)
            for wake in wakes:
                wake()

    def status(self):
        return {"kicks": self.kicks, "woken": self.woken, "asked": self.asked}

    def close(self):
        """Wake every waiter and stop the kick reader."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            wakes = [w for _, w in self._waiters.values()]
            self._waiters.clear()
            self._write_due(NEVER)
        for wake in wakes:
            wake()
        os.write(self._stop_w, b"x")
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._due.close()
        self._kicks.close()
        os.close(self._stop_r)
        os.close(self._stop_w)
