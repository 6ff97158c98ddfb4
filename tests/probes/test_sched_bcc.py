"""The bcc sched probe against the kernel's own per-thread counters, on real scheduling."""

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
from stallscope.probes.base import ProbeSettings
from stallscope.probes.sched_bcc import BccSchedProbe

pytestmark = pytest.mark.privileged


@pytest.fixture(scope="module")
def probe():
    reason = BccSchedProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    p = BccSchedProbe()
    p.sink = CollectSink()
    p.start(p.sink)
    yield p
    p.stop()


@pytest.fixture
def work(probe):
    w = Workload()
    probe.track(w.pid)
    w.start_thread()  # created after track(): must be followed
    yield w
    probe.untrack(w.pid)
    w.close()


def _unseen(probe, work):
    """(voluntary, preempted) switch-outs of the worker reported lost so far."""

    def unseen():
        probe.verify()
        probe._check_losses()
        st = probe.status()
        vol, inv = st["unseen"].get(work.tid, (0, 0))
        # only this worker is tracked here, so the global counters are its own
        lost_pre, lost_vol = st["lost_switch_in"]
        return vol + lost_vol, inv + lost_pre

    return unseen


def test_contended_thread_matches_proc(probe, work):
    check_contended(probe, probe.sink, work, probe.drain, _unseen(probe, work))
    # every loss written says what was lost; none is a full ring
    for loss in probe.sink.losses:
        assert "not report" in loss[4] or "skipped by the kernel" in loss[4], loss


def test_affinity_flips_are_migrations(probe, work):
    check_flips(probe, probe.sink, work, probe.drain)


def test_events_fall_inside_markers(probe, work):
    check_markers(probe, probe.sink, work, probe.drain, unseen=_unseen(probe, work))


def test_untracked_process_gives_no_rows(probe):
    check_untrack(probe, probe.sink, probe.drain)


def test_status_reports_reader_work(probe):
    st = probe.status()
    assert st["backend"] == "bcc" and st["resolution_ns"] == 0
    assert st["records"] > 0 and st["drains"] > 0
    assert st["lost_reserve"] == 0


def test_unavailable_says_how_to_fix(monkeypatch):
    import stallscope.probes.sched_bcc as mod

    monkeypatch.setattr(mod, "_has_bpf_privileges", lambda: False)
    assert "CAP_BPF+CAP_PERFMON" in BccSchedProbe.unavailable()
    monkeypatch.setattr(mod, "_has_bpf_privileges", lambda: True)
    monkeypatch.setattr(mod, "TRACEFS", "/nonexistent/tracing")
    reason = BccSchedProbe.unavailable()
    if reason.startswith("bcc not installed"):
        assert "apt-get install python3-bpfcc" in reason
    else:
        assert "mount -t tracefs" in reason


def test_ring_overflow_is_counted_as_loss():
    """A one-page ring and no reader: failed reserves must reach sink.loss."""
    reason = BccSchedProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    sink = CollectSink()
    p = BccSchedProbe(ProbeSettings(sched_ring_pages=1, sched_poll_ms=60000))
    p.start(sink)
    w = Workload()
    try:
        p.track(w.pid)
        w.start_thread()
        w.call("pin 0")
        w.call("flip 400")  # 400 migration records, ~85 fit in a page
        p._check_losses()
        p.drain()
    finally:
        w.close()
        p.stop()
    lost = sum(loss[3] for loss in sink.losses)
    kept = len(sink.table("migrations").get("tid", []))
    assert lost > 0
    assert "ring buffer full" in sink.losses[0][4]
    assert kept + lost >= 400


def test_summaries_keep_their_period_between_ring_reads():
    """A summarised pool worker's sched_summary rows come every ~0.2 s while
    the ring, whose reads then come back small, is read up to 1 s apart:
    taking the summaries reads the mmapped array, not the ring (a ring read
    costs ~1-2 ms of the reader's CPU, and it was paid at every summary)."""
    reason = BccSchedProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    sink = CollectSink()
    p = BccSchedProbe(ProbeSettings(sched_summary_after_ms=0))
    p.start(sink)
    w = Workload()
    try:
        p.track(w.pid)
        w.start_thread()
        p.detail_threads(w.pid, [w.pid])  # the process runs steps on its main thread
        w.call("spin 2500")  # seen in exact records, then summarised; reads slow down
        assert w.tid in p.status()["summarised_tids"]

        def rows():
            return sum(1 for t in sink.table("sched_summary").get("tid", []) if t == w.tid)

        drains0, rows0 = p.status()["drains"], rows()
        w.call("spin 3000")
        drains, summaries = p.status()["drains"] - drains0, rows() - rows0
    finally:
        w.close()
        p.stop()
    assert summaries >= 10, summaries  # 3 s at one row per 0.2 s
    assert drains <= summaries / 2, (drains, summaries)
