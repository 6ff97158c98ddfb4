"""The daemon's stop request, taken from the first moment the command runs.

`install()` is the first thing `stallscope daemon` does (before parsing the
configuration, opening the database, compiling eBPF programs or creating the
probe socket): SIGTERM and SIGINT then only set `STOP`, and the daemon, at
whatever phase of start-up it is, finishes opening what it opens, reads what
clients already sent, stores it and exits 0. Python's own default (die with
status 143) applies only for the few milliseconds before `install()`, when
nothing has been opened or accepted, so nothing can be lost then: a socket
that systemd holds keeps its queue for the next start. SIGUSR2 writes every
thread's Python stack to stderr (the journal), from the signal handler
itself, so it answers even when no thread of the daemon gets a CPU: a stop
that takes too long says where it waits. Never used by library code that
runs inside tests: they pass their own event.
"""

import faulthandler
import signal
import sys
import threading

STOP = threading.Event()


def _request_stop(signum, frame):
    STOP.set()


def install():
    """Route SIGTERM and SIGINT to STOP, SIGUSR2 to a dump of every
    thread's stack; returns STOP."""
    signal.signal(signal.SIGTERM, _request_stop)
    signal.signal(signal.SIGINT, _request_stop)
    try:
        faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True)
    except (ValueError, OSError, AttributeError):  # no usable stderr: no dump
        pass
    return STOP
