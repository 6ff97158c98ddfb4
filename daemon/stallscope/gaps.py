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
kick to a ring with a wake-up (sched_bcc.c `gap_kicks`); one thread, at
idle priority, reads the kicks and wakes every waiter that is due
(`probes/gap_kicks.GapClock`, installed here by the sched probe), so the
kernel kicks only when asked and the daemon wakes only in gaps. Without the
sched probe's bcc backend (or with `sched_gap_clock = false`) `wait()`
sleeps `soft_s`, as a timer did.
"""

import threading
import time

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
