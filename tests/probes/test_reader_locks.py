"""The main loop never waits for a probe's reader, and a reader that falls
behind does not wait for the main loop.

A reader drains its ring at idle priority: on a host whose CPUs are all
busy one drain can take seconds (a module's symbols loaded for the first
native leaf). The main loop calls into the same probes for every client
(track, a layout report, the step threads, untrack); when those calls took
the lock a drain held, a client's layout report waited out the whole run
(its samples all native-only, the ring never read). Here a drain is held
inside its slowest part and the main loop's calls must return meanwhile;
what they changed takes effect once the drain ends. No kernel needed: the
rings are stand-ins. And the main loop, at idle priority itself while its
clients send slowly, was late to raise a reader whose ring filled (99 % of
the CPU sampler's beside two CPU hogs): a reader past half its ring raises
itself (threads.keep_up), the main loop lowers it again.
"""

import os
import threading

import numpy as np
import pyarrow as pa
import pytest

from helpers.privileged import is_root, require_privileged
from stallscope import threads
from stallscope.probes.cpu_bcc import RING_LOSSES, BccCpuProbe
from stallscope.probes.sched_bcc import BccSchedProbe

PID = 4242
RETURN_S = 5.0  # far above what the calls take unblocked (microseconds)


class _Sink:
    def __init__(self):
        self.rows = []

    def append(self, table, columns):
        self.rows.append(table)

    def loss(self, *args):
        pass

    def status(self, *args):
        pass


class _Ring:
    def peek(self):
        return np.zeros(1, dtype=[("ts_ns", "<u8")])

    def release(self):
        pass

    def fill(self):
        return 0.0


class _SymRing:
    def read(self):
        return []


class _Counters:
    def read(self):
        return dict.fromkeys(RING_LOSSES, 0)


def _returns_while_held(calls):
    """Run `calls` on a thread; whether they all returned within RETURN_S."""
    done = threading.Event()

    def run():
        for call in calls:
            call()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(RETURN_S)


def test_the_cpu_probes_track_report_and_untrack_do_not_wait_for_a_drain(report):
    probe = BccCpuProbe()
    probe._ring, probe._sym_ring, probe._counters = _Ring(), _SymRing(), _Counters()
    probe._sink = _Sink()
    inside, finish = threading.Event(), threading.Event()

    def slow_resolve(recs):  # the drain's slow part: a module's symbols loading
        inside.set()
        assert finish.wait(30)
        return {
            "cpu_samples": {
                "ts_ns": np.array([1], dtype=np.int64),
                "unwind": pa.array([None], pa.dictionary(pa.int8(), pa.string())),
            }
        }

    probe.stacks.resolve = slow_resolve
    drain = threading.Thread(target=probe.drain, daemon=True)
    drain.start()
    assert inside.wait(10)
    probe.stacks.set_version(PID, (3, 11))
    returned = _returns_while_held(
        [
            lambda: probe.track(PID),
            lambda: probe.accept_layout(PID, 1, report),
            lambda: probe.set_threads(PID, 1, [(PID, 0x1000)]),
            lambda: probe.untrack(PID),
        ]
    )
    still_draining = drain.is_alive()
    finish.set()
    drain.join(10)
    assert returned and still_draining
    # the untracked process's tables were forgotten by the drain, after its samples
    assert PID not in probe.stacks.versions
    assert probe.samples == 1 and "cpu_samples" in probe._sink.rows


def test_the_sched_probes_untrack_and_step_threads_do_not_wait_for_a_drain():
    probe = BccSchedProbe()
    probe._verify_base[(PID, PID)] = (1, 2)
    probe._verify_base[(PID + 1, PID + 1)] = (1, 2)
    held, finish = threading.Event(), threading.Event()

    def drain():  # holds the drainer's lock as a drain does
        with probe._lock:
            held.set()
            assert finish.wait(30)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    assert held.wait(10)
    returned = _returns_while_held(
        [lambda: probe.detail_threads(PID, [PID]), lambda: probe.untrack(PID)]
    )
    changed_meanwhile = (PID, PID) not in probe._verify_base
    finish.set()
    t.join(10)
    assert returned and not changed_meanwhile
    probe.verify()  # the lock's next holder applies what was queued, in order
    assert (PID, PID) not in probe._verify_base and (PID + 1, PID + 1) in probe._verify_base
    assert not probe._pending


@pytest.mark.privileged
def test_a_reader_past_half_its_ring_raises_itself_and_the_main_loop_lowers_it():
    require_privileged(is_root(), "raising a thread from idle priority needs CAP_SYS_NICE")
    level = {"v": 0.0}
    out = {}

    def reader():
        threads.background("test-reader", backlog=lambda: level["v"])
        try:
            out["start"] = os.sched_getscheduler(0)
            level["v"] = threads.BOOST_ABOVE - 0.1
            out["below"] = threads.keep_up(), os.sched_getscheduler(0)
            level["v"] = threads.BOOST_ABOVE + 0.1
            out["above"] = threads.keep_up(), os.sched_getscheduler(0)
            level["v"] = threads.UNBOOST_BELOW / 2
            threads.check_backlogs()  # the main loop's part
            out["drained"] = os.sched_getscheduler(0)
        finally:
            threads.forget()

    t = threading.Thread(target=reader)
    t.start()
    t.join(10)
    assert out["start"] == threads.SCHED_IDLE
    assert out["below"] == (False, threads.SCHED_IDLE)
    assert out["above"] == (True, threads.SCHED_OTHER)
    assert out["drained"] == threads.SCHED_IDLE
