"""A probe's reader sleeps while no process is followed (probes.base.ReaderPark).

Unit tests on the wait alone: it keeps the reader's cadence while a process
is followed and for PARK_AFTER_S after the last one left, then blocks until
a process is followed again or the probe stops (with a look every
PARK_CHECK_S), so an idle daemon's readers stop waking.
"""

import threading
import time

from stallscope.probes import base


def _waiter(park, stop, wait_s):
    done = threading.Event()
    out = {}

    def run():
        t0 = time.monotonic()
        out["stopped"] = park.wait(stop, wait_s)
        out["took"] = time.monotonic() - t0
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, out


def test_followed_keeps_the_cadence_and_nothing_followed_parks(monkeypatch):
    monkeypatch.setattr(base, "PARK_AFTER_S", 0.2)
    monkeypatch.setattr(base, "PARK_CHECK_S", 30.0)
    park, stop = base.ReaderPark(), threading.Event()
    park.followed(1)
    time.sleep(0.3)
    assert not park.parked  # followed: never parked
    done, out = _waiter(park, stop, 0.05)
    assert done.wait(5) and out == {"stopped": False, "took": out["took"]}
    park.followed(0)  # the last process left: the cadence goes on a while
    assert not park.parked
    time.sleep(0.3)
    assert park.parked
    done, out = _waiter(park, stop, 0.05)
    assert not done.wait(0.5)  # parked: the 0.05 s wait is not kept
    park.followed(1)  # a process to follow wakes it at once
    assert done.wait(5) and out["stopped"] is False
    assert not park.parked


def test_stop_wakes_a_parked_reader(monkeypatch):
    monkeypatch.setattr(base, "PARK_AFTER_S", 0.0)
    monkeypatch.setattr(base, "PARK_CHECK_S", 30.0)
    park, stop = base.ReaderPark(), threading.Event()
    done, out = _waiter(park, stop, 0.05)
    assert not done.wait(0.3)
    stop.set()
    park.wake()
    assert done.wait(5) and out["stopped"] is True


def test_hurry_cuts_a_long_wait_and_stop_with_wake_ends_it():
    """A reader that sleeps up to a second between small reads is woken
    early when its ring fills (hurry), and at once when the probe stops."""
    park, stop = base.ReaderPark(), threading.Event()
    park.followed(1)
    park.wait(stop, 0.0)  # the followed() wake-up is spent
    done, out = _waiter(park, stop, 30.0)
    assert not done.wait(0.3)  # the long wait holds
    park.hurry()
    assert done.wait(5) and out["stopped"] is False and out["took"] < 5
    done, out = _waiter(park, stop, 30.0)
    assert not done.wait(0.3)
    stop.set()
    park.wake()
    assert done.wait(5) and out["stopped"] is True


def test_a_backlog_over_the_hurry_share_wakes_its_thread(monkeypatch):
    """threads._check (the main loop, every 0.1 s) calls a background
    thread's hurry() while its backlog is over HURRY_ABOVE, and not below."""
    from stallscope import threads

    monkeypatch.setattr(threads, "boost", lambda tid=None: False)
    calls = []
    level = {"v": 0.0}
    info = {
        "name": "t",
        "role": threads.BACKGROUND,
        "boosted": False,
        "backlog": lambda: level["v"],
        "hurry": lambda: calls.append(level["v"]),
    }
    for v in (0.0, threads.HURRY_ABOVE / 2, threads.HURRY_ABOVE * 2, 0.3, 0.01):
        level["v"] = v
        threads._check(0, info)
    assert calls == [threads.HURRY_ABOVE * 2, 0.3]
