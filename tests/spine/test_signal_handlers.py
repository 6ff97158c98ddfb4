"""The daemon's SIGTERM/SIGINT/SIGHUP handlers take no lock.

A handler runs in the main thread between two of its bytecodes. The main
loop used to wait on its stop Event (a light round's gather), and the
handler called that Event's set(), which waits for the lock the
interrupted wait() holds: the daemon hung until SIGKILL (seen once in CI,
tests/e2e/test_placement_e2e.py). The handler now sets a flag and wakes the
loop's wake-up pipe; the loop sets the Event itself."""

import signal
import threading
import types

from stallscope.service.server import Daemon


class FakeIngest:
    def __init__(self):
        self.woken = 0

    def wake(self):
        self.woken += 1


def fake_daemon():
    d = types.SimpleNamespace(
        _stop=threading.Event(), _stop_asked=False, _reload_asked=False, ingest=FakeIngest()
    )
    d._signalled = types.MethodType(Daemon._signalled, d)
    d._stopping = types.MethodType(Daemon._stopping, d)
    return d


def run_inside_the_events_wait(d, signum):
    """Call the handler with the stop Event's lock held, as the main loop
    holds it inside `_stop.wait()`; True if the handler returned."""
    done = threading.Event()

    def interrupted_main_thread():
        with d._stop._cond:
            d._signalled(signum, None)
        done.set()

    t = threading.Thread(target=interrupted_main_thread, daemon=True)
    t.start()
    t.join(5)
    return done.is_set()


def test_sigterm_inside_a_wait_on_the_stop_event_returns_and_stops_the_loop():
    d = fake_daemon()
    assert run_inside_the_events_wait(d, signal.SIGTERM)
    assert d.ingest.woken == 1
    assert not d._stop.is_set()  # the handler only asked
    assert d._stopping() and d._stop.is_set()  # the loop stops on it


def test_sighup_asks_for_a_reload_and_does_not_stop():
    d = fake_daemon()
    assert run_inside_the_events_wait(d, signal.SIGHUP)
    assert d._reload_asked and d.ingest.woken == 1
    assert not d._stopping()


def test_the_ingest_sleep_ends_at_a_wake(tmp_path):
    import time

    from stallscope.ingest.listener import Ingest

    ing = Ingest.__new__(Ingest)
    import os

    ing._wake_r, ing._wake_w = os.pipe()
    try:
        t0 = time.monotonic()
        threading.Timer(0.05, ing.wake).start()
        ing.sleep(5.0)
        assert time.monotonic() - t0 < 2.0
        # the pending byte stays for poll(): the next sleep ends at once too
        t0 = time.monotonic()
        ing.sleep(5.0)
        assert time.monotonic() - t0 < 1.0
    finally:
        os.close(ing._wake_r)
        os.close(ing._wake_w)
