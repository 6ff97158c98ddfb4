"""The daemon's stop request, taken from the first moment the command runs.

`install()` is the first thing `stallscope daemon` does (before parsing the
configuration, opening the database, compiling eBPF programs or creating the
probe socket): SIGTERM and SIGINT then only set `STOP`, and the daemon, at
whatever phase of start-up it is, finishes opening what it opens, reads what
clients already sent, stores it and exits 0. Python's own default (die with
status 143) applies only for the few milliseconds before `install()`, when
nothing has been opened or accepted, so nothing can be lost then: a socket
that systemd holds keeps its queue for the next start. Never used by library
code that runs inside tests: they pass their own event.
"""

import signal
import threading

STOP = threading.Event()


def _request_stop(signum, frame):
    STOP.set()


def install():
    """Route SIGTERM and SIGINT to STOP; returns STOP."""
    signal.signal(signal.SIGTERM, _request_stop)
    signal.signal(signal.SIGINT, _request_stop)
    return STOP
