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
