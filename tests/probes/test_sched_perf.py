"""The perf_event_open sched probe against the kernel's own per-thread counters."""

import time

import pytest

from helpers.privileged import require_privileged
from helpers.sched import (
    CollectSink,
    Workload,
    check_contended,
    check_flips,
    check_markers,
    check_untrack,
)
from stallscope.probes.sched_perf import PerfSchedProbe

pytestmark = pytest.mark.privileged


@pytest.fixture(scope="module")
def probe():
    reason = PerfSchedProbe.unavailable()
    require_privileged(reason is None, f"perf backend unavailable: {reason}")
    p = PerfSchedProbe()
    p.sink = CollectSink()
    p.start(p.sink)
    # the worker is asleep when the tests sync: nothing is in flight, so
    # the holdback for cross-CPU ordering can be skipped
    p.sync = lambda: p.drain(final=True)
    yield p
    p.stop()


@pytest.fixture
def work(probe):
    w = Workload()
    probe.track(w.pid)
    w.start_thread()  # created after track(): found by the /proc rescan
    deadline = time.monotonic() + 5
    while w.tid not in probe.migrations_counted() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.tid in probe.migrations_counted(), "new thread not followed"
    yield w
    probe.untrack(w.pid)
    w.close()


def test_contended_thread_matches_proc(probe, work):
    check_contended(probe, probe.sink, work, probe.sync)


def test_affinity_flips_are_migrations(probe, work):
    before = probe.migrations_counted()[work.tid]
    w = check_flips(probe, probe.sink, work, probe.sync)
    # the per-thread software counter agrees with the kernel's nr_migrations
    assert probe.migrations_counted()[work.tid] - before >= w.delta("nr_migrations")


def test_events_fall_inside_markers(probe, work):
    check_markers(probe, probe.sink, work, probe.sync)


def test_untracked_process_gives_no_rows(probe):
    check_untrack(probe, probe.sink, probe.sync)


def test_status(probe):
    st = probe.status()
    assert st["backend"] == "perf" and st["resolution_ns"] == 0
    assert st["records"] > 0
