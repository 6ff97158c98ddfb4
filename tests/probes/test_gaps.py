"""The gap clock (stallscope/gaps.py) on the real sched program: a wait ends
at the first moment after its soft time that a traced thread goes to sleep
and leaves its CPU idle, or at its hard limit when none does; without a
clock it is the plain timer it replaced."""

import collections
import subprocess
import sys
import threading
import time

import pytest

from helpers.privileged import require_privileged
from helpers.sched import CollectSink
from stallscope import gaps
from stallscope.probes.base import ProbeSettings

# Busy ~3 ms, asleep 30 ms, for a minute (killed at the end of the test).
SLEEPER = (
    "import time\n"
    "while True:\n"
    "    t = time.perf_counter()\n"
    "    while time.perf_counter() - t < 0.003: pass\n"
    "    time.sleep(0.03)\n"
)
SPINNER = "while True: pass\n"


@pytest.fixture
def probe():
    from stallscope.probes.sched_bcc import BccSchedProbe

    reason = BccSchedProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    p = BccSchedProbe()
    p.start(CollectSink())
    yield p
    p.stop()


def child(code):
    return subprocess.Popen([sys.executable, "-c", code])


def timed_wait(soft_s, hard_s):
    ev = threading.Event()
    t = time.monotonic()
    gaps.wait(soft_s, hard_s, ev.set, ev.wait)
    return time.monotonic() - t


def test_without_a_clock_a_wait_is_its_soft_time():
    assert gaps.current() is None
    took = timed_wait(0.1, 5.0)
    assert 0.09 <= took < 2.0, took


@pytest.mark.privileged
def test_a_wait_ends_at_a_gap_a_traced_thread_leaves(probe):
    clock = gaps.current()
    assert clock is not None
    proc = child(SLEEPER)
    try:
        probe.track(proc.pid)
        time.sleep(0.3)
        took = [timed_wait(0.1, 3.0) for _ in range(5)]
    finally:
        proc.kill()
        proc.wait()
    st = clock.status()
    # The sleeper leaves its CPU idle ~30 times a second: each wait ends at
    # a gap after its soft time (or up to COALESCE_S before it), not at its
    # 3 s limit.
    assert all(0.1 - gaps.COALESCE_S - 0.005 <= t < 1.5 for t in took), took
    assert st["woken"] >= 5 and st["kicks"] >= 5, st


@pytest.mark.privileged
def test_no_gap_no_kick_the_wait_runs_to_its_limit(probe):
    """A traced thread that never sleeps leaves no gap (and untraced ones
    are not asked about): the wait ends at its hard limit."""
    clock = gaps.current()
    proc = child(SPINNER)
    try:
        probe.track(proc.pid)
        time.sleep(0.2)
        before = clock.status()["kicks"]
        took = timed_wait(0.1, 0.6)
    finally:
        proc.kill()
        proc.wait()
    assert took >= 0.55, took
    assert clock.status()["kicks"] == before


@pytest.mark.privileged
def test_stopping_the_probe_wakes_its_waiters(probe):
    clock = gaps.current()
    done = []
    t = threading.Thread(target=lambda: done.append(timed_wait(5.0, 10.0)))
    t.start()
    time.sleep(0.3)
    probe.stop()
    t.join(timeout=5)
    assert done and done[0] < 2.0, done
    assert gaps.current() is None and clock.status()["asked"] >= 1


@pytest.mark.privileged
def test_the_setting_turns_it_off():
    from stallscope.probes.sched_bcc import BccSchedProbe

    reason = BccSchedProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    p = BccSchedProbe(ProbeSettings(sched_gap_clock=False))
    p.start(CollectSink())
    try:
        assert gaps.current() is None and p.status()["gap_clock"] is None
    finally:
        p.stop()


@pytest.mark.privileged
def test_the_cpu_samplers_reader_waits_for_gaps_too(probe):
    """The CPU sampler's reader (every cpu_poll_ms while samples come) asks
    the clock for its waits, and a traced sleeper's gaps end them: its reads
    do not come on a timer while the engine runs."""
    from stallscope.probes.cpu_bcc import BccCpuProbe

    reason = BccCpuProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    clock = gaps.current()
    asked, woken = collections.Counter(), collections.Counter()
    arm = clock.arm

    def recording_arm(due_ns, wake):
        name = threading.current_thread().name
        asked[name] += 1

        def kicked():
            woken[name] += 1
            wake()

        return arm(due_ns, kicked)

    clock.arm = recording_arm
    cpu = BccCpuProbe()
    cpu.start(CollectSink())
    proc = child(SLEEPER)
    try:
        probe.track(proc.pid)
        cpu.track(proc.pid)
        time.sleep(2.5)
        drains = cpu.drains
    finally:
        cpu.stop()
        proc.kill()
        proc.wait()
    reader = "stallscope-cpu-bcc"
    assert asked[reader] >= 3 and woken[reader] >= 2, (asked, woken)
    assert drains >= 3, drains
