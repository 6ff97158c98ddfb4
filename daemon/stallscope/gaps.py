"""The gap clock: the daemon's periodic work, timed to moments the traced
engine leaves a CPU idle.

A thread woken by a timer beside a busy engine takes the engine's CPU at
the end of the engine's slice, whatever the thread's priority (EEVDF:
BENCHMARKS.md, "kernel: a low-priority thread waking beside a busy
engine"), so the daemon's preemptions of an engine on full CPUs follow its
timer wake-ups. A waiter here asks for the first moment after `soft_s` at
which a traced thread goes to sleep and leaves its CPU idle, and gives a
`hard_s` by which it wakes anyway (an engine that never sleeps, or none
traced). The sched probe's kernel program sees those moments (sched_switch
to the idle task) and, once the earliest waiter's time has come, writes one
kick to a ring with a wake-up (sched_bcc.c `gap_kicks`); one thread here, at
idle priority, reads the kicks and wakes every waiter that is due, so the
kernel kicks only when asked and the daemon wakes only in gaps. Without the
sched probe's bcc backend (or with `sched_gap_clock = false`) `wait()`
sleeps `soft_s`, as a timer did.
"""

import itertools
import mmap
import os
import select
import struct
import threading
import time

from stallscope import threads

PAGE_SIZE = mmap.PAGESIZE
NEVER = (1 << 64) - 1
# A kick also wakes the waiters due within this much of it: one gap serves
# the main loop and the ring readers together, and the kick reader wakes
# once for them (waking one waiter a kick doubled its wake-ups, 7.7 -> 14.7
# a second, and the unpinned benchmark's preemptions did not fall).
COALESCE_S = 0.05
# Waits shorter than this are left to the timer: a gap may be a few ms
# away, and such a waiter (the live stream's 5 ms decodes, a hurried ring
# reader) is already late.
MIN_GAP_WAIT_S = 0.05
# How late a waiter may be past its soft time when no gap comes: its wait
# again, up to this (a ring reader's 1 s read then comes by 1.5 s; the rings
# are sized for 0.4 s of 200k events/s and a filling ring hurries its reader
# whatever the clock says).
MAX_LATE_S = 0.5

_clock = None
_install_lock = threading.Lock()


def late_by(soft_s):
    """The hard limit a periodic waiter gives for a soft wait of `soft_s`."""
    return soft_s + min(soft_s, MAX_LATE_S)


def wait(soft_s, hard_s, wake, sleep):
    """Sleep until the first gap after `soft_s` seconds, or `hard_s` at the
    latest: `sleep(t)` is the caller's own wait (it may return early: a stop,
    a hurry, a signal), `wake()` ends it from another thread. Returns what
    `sleep` returned. Without a gap clock, or for a short wait, `sleep(soft_s)`."""
    clock = _clock
    if clock is None or soft_s < MIN_GAP_WAIT_S or hard_s <= soft_s:
        return sleep(soft_s)
    token = clock.arm(time.monotonic_ns() + int(soft_s * 1e9), wake)
    try:
        return sleep(hard_s)
    finally:
        clock.disarm(token)


def install(clock):
    """Make `clock` the one wait() uses (closing any before it)."""
    global _clock
    with _install_lock:
        old, _clock = _clock, clock
    if old is not None and old is not clock:
        old.close()


def uninstall(clock):
    """Stop using `clock` (if it is the installed one) and close it: its
    waiters wake at once."""
    global _clock
    with _install_lock:
        if _clock is clock:
            _clock = None
    clock.close()


def current():
    return _clock


class GapClock:
    """The waiters and the kick reader of one loaded sched program (`bpf`,
    a bcc BPF object holding `gap_due` and `gap_kicks`)."""

    def __init__(self, bpf):
        due_fd = bpf[b"gap_due"].map_fd
        ring_fd = bpf[b"gap_kicks"].map_fd
        # BPF_F_MMAPABLE: the due time is written without a bpf() syscall (a
        # map syscall makes the CPU skip tracepoint programs meanwhile).
        self._due = mmap.mmap(due_fd, PAGE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        # A ring's page 0 is the consumer position (ours), page 1 the producer's.
        self._cons = mmap.mmap(
            ring_fd, PAGE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0
        )
        self._prod = mmap.mmap(
            ring_fd, PAGE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ, offset=PAGE_SIZE
        )
        self._ring_fd = ring_fd
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
        self._consume()
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

    def _consume(self):
        """Hand every kick back to the kernel; how many bytes there were."""
        prod = struct.unpack_from("<Q", self._prod, 0)[0]
        cons = struct.unpack_from("<Q", self._cons, 0)[0]
        if prod != cons:
            struct.pack_into("<Q", self._cons, 0, prod)
        return prod - cons

    def _run(self):
        threads.background("gaps")
        while True:
            try:
                ready, _, _ = select.select([self._ring_fd, self._stop_r], [], [])
            except (OSError, ValueError):
                return
            if self._stop_r in ready or self._closed:
                return
            if not self._consume():
                continue
            now = time.monotonic_ns()
            with self._lock:
                self.kicks += 1
                # The kernel set its due time to never at the kick.
                self._armed = NEVER
                horizon = now + int(COALESCE_S * 1e9)
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
        for m in (self._due, self._cons, self._prod):
            m.close()
        os.close(self._stop_r)
        os.close(self._stop_w)
