"""GC records in bursts: the ring holds them, drains itself, and labels overflow.

An engine that builds a large heap right after connect() makes ~1,150 gen-0
collections before its first step (so before any flush): every one must be
stored. When the ring does overflow (here forced: a small ring while the
buffer lock is held, so the GC callback cannot drain it), the records lost
are reported with their own reason, `client_gc_ring_full`, not as a full
socket, and made = stored + reported, exactly.
"""

import gc

import pytest

import probe_client
import probe_client._transport as transport

pytestmark = pytest.mark.daemon


def _collections():
    return sum(s["collections"] for s in gc.get_stats())


def _reconcile(d, probe):
    stored = d.scalar("SELECT count(*) FROM gc_events")
    losses = dict(d.query("SELECT reason, sum(count)::BIGINT FROM losses GROUP BY ALL"))
    return stored, losses


def test_heap_built_right_after_connect_loses_no_gc_record(daemon):
    # the passes per allocation depend on the gen-0 threshold: 700 up to
    # 3.12, 2,000 from 3.13 (set here so that every interpreter makes the
    # burst of ~1,150 passes)
    threshold = gc.get_threshold()
    gc.set_threshold(700, *threshold[1:])
    gc.collect()
    before = _collections()
    probe = probe_client.connect(socket_path=daemon.socket, run_label="burst")
    heap = [[] for _ in range(800_000)]  # ~1,150 gen-0 passes, no span end, no flush
    gc.disable()  # no pass between counting them and close()
    try:
        made = _collections() - before
        probe.close()
    finally:
        gc.enable()
        gc.set_threshold(*threshold)
    del heap
    assert daemon.stop()[0] == 0
    stored, losses = _reconcile(daemon, probe)
    assert made > 1000
    assert probe.stats()["drops_gc_ring"] == 0
    assert stored == made and losses == {}, (made, stored, losses)


def test_ring_overflow_has_its_own_loss_reason(daemon, monkeypatch):
    monkeypatch.setattr(transport, "GC_RING_SLOTS", 16)
    n = 100
    gc.disable()  # only the passes below: exact counts
    try:
        probe = probe_client.connect(socket_path=daemon.socket, run_label="ring")
        probe.flush()
        probe._lock.acquire()  # as if a thread were inside a send: no drain possible
        try:
            for _ in range(n):
                gc.collect(0)
        finally:
            probe._lock.release()
        for _ in range(5):  # after the overflow, the ring works again
            gc.collect(0)
        probe.close()
    finally:
        gc.enable()
    assert daemon.stop()[0] == 0
    stats = probe.stats()
    stored, losses = _reconcile(daemon, probe)
    assert stats["drops_gc_ring"] == n - 16
    assert losses == {"client_gc_ring_full": n - 16}, losses
    assert stored + sum(losses.values()) == stats["next_seq"]
    assert stored >= 16 + 5


@pytest.mark.parametrize("slots", [64])
def test_gc_callback_drains_the_ring_past_half_full(daemon, monkeypatch, slots):
    """No flush and no flusher chance (the lock is free, nothing sends): the
    callback itself moves the ring into the buffer once it is half full."""
    monkeypatch.setattr(transport, "GC_RING_SLOTS", slots)
    probe = probe_client.connect(socket_path=daemon.socket, run_label="drain")
    for _ in range(slots * 3):
        gc.collect(0)
    assert probe._gc_w - probe._gc_r < slots  # never overflowed
    assert probe.stats()["drops_gc_ring"] == 0
    probe.close()
    assert daemon.stop()[0] == 0
    stored, losses = _reconcile(daemon, probe)
    assert losses == {} and stored == probe.stats()["next_seq"]
