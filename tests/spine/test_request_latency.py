"""Request latency from a real daemon, against the engine's own clock, and what a GC pause did to it.

A small continuous-batching engine (at most 8 requests a step, requests
arriving between steps, each wanting a known number of tokens, half of
them with str ids and half with int ids) reports its requests through
`probe.request` and `probe.request_tokens` and its steps as spans, and keeps
its own record of when each request arrived, got its first token and
finished. `request_latency` must match that record to 1 ms for every
request, with exact token counts. One step is stalled by a full
`gc.collect()` of a large cyclic heap (automatic collection is off, so it
is the only pass of the run): the requests in flight then (a token before
that step and one in it), and only those, have `worst_cause = 'gc'` and
`itl_max_ns` at least the pause the engine measured around the call.
"""

import gc
import time

import pytest

import probe_client
from helpers.daemonproc import DaemonProcess

pytestmark = pytest.mark.daemon

REQUESTS = 40
MAX_BATCH = 8
STEP_S = 0.004
STALL_STEP = 25
MS = 1_000_000


class Engine:
    """Continuous batching with its own clock (time.monotonic_ns read just
    before each report)."""

    def __init__(self, probe):
        self.probe = probe
        self.queue = []
        self.active = []
        self.want = {}
        self.got = {}
        self.arrived = {}
        self.first_token = {}
        self.finished = {}
        self.steps = 0
        self.stall = None  # (ns paused, requests in flight)

    def arrive(self, rid, tokens):
        self.arrived[rid] = time.monotonic_ns()
        self.probe.request(rid, "arrived")
        self.want[rid] = tokens
        self.got[rid] = 0
        self.queue.append(rid)

    def step(self, heap=None):
        probe = self.probe
        t0 = probe.begin()
        while self.queue and len(self.active) < MAX_BATCH:
            rid = self.queue.pop(0)
            probe.request(rid, "scheduled")
            self.active.append(rid)
        time.sleep(STEP_S)  # the model's forward pass
        if heap is not None:
            in_flight = {r for r in self.active if self.got[r] > 0}
            g0 = time.monotonic_ns()
            gc.collect()
            self.stall = (time.monotonic_ns() - g0, in_flight)
        now = time.monotonic_ns()
        probe.request_tokens(self.active, 1)
        done = []
        for rid in self.active:
            self.got[rid] += 1
            self.first_token.setdefault(rid, now)
            if self.got[rid] == self.want[rid]:
                done.append(rid)
        for rid in done:
            self.finished[rid] = time.monotonic_ns()
            probe.request(rid, "finished")
            self.active.remove(rid)
        probe.end("step", t0, stage="decode", batch=len(self.active) + len(done))
        self.steps += 1


def _cyclic_heap(n):
    """n pairs of lists that refer to each other: only a collection frees them."""
    heap = []
    for _ in range(n):
        a, b = [], []
        a.append(b)
        b.append(a)
        heap.append(a)
    return heap


def test_request_latency_matches_the_engine_and_names_the_gc_pause(tmp_path, gc_off):
    daemon = DaemonProcess(tmp_path).start()
    probe = probe_client.connect(socket_path=daemon.socket, gc=True)
    engine = Engine(probe)
    ids = [f"req-{i}" if i % 2 else 1000 + i for i in range(REQUESTS)]
    heap = None
    try:
        i = 0
        while i < REQUESTS or engine.active or engine.queue:
            for _ in range(2):  # two arrivals between steps
                if i < REQUESTS:
                    engine.arrive(ids[i], 4 + (i * 7) % 9)
                    i += 1
            if engine.steps == STALL_STEP - 1:
                heap = _cyclic_heap(400_000)
                del heap[:]  # unreachable now, freed only by a collection
            engine.step(heap if engine.steps == STALL_STEP else None)
        assert probe.errors == 0, probe.stats()
        made = probe.stats()["next_seq"]
    finally:
        probe.close()
        assert daemon.stop()[0] == 0, daemon.read_log()
    pause_ns, in_flight = engine.stall
    assert pause_ns > 20 * MS and len(in_flight) >= 4, (pause_ns, in_flight)
    assert daemon.query("SELECT reason, sum(count) FROM ingest_errors GROUP BY ALL") == []
    # every record the client numbered (steps, GC passes, request events and
    # texts) is stored or a counted loss
    stored, lost = daemon.query(
        "SELECT records, (SELECT coalesce(sum(count), 0) FROM losses WHERE run_id = r.run_id) "
        "FROM runs r"
    )[0]
    assert stored + lost == made, (stored, lost, made)

    key = {probe_client.request_key(r): r for r in ids}
    rows = daemon.query(
        "SELECT request_id, text, arrival_ns, ttft_ns, e2e_ns, queue_ns, itl_max_ns, "
        "output_tokens, worst_cause, end_event FROM request_latency"
    )
    assert len(rows) == REQUESTS
    gc_hit = set()
    for rid64, text, arrival, ttft, e2e, queue, itl_max, tokens, cause, end in rows:
        rid = key[rid64]
        assert text == (rid if isinstance(rid, str) else None)
        assert abs(arrival - engine.arrived[rid]) < MS, rid
        assert abs(ttft - (engine.first_token[rid] - engine.arrived[rid])) < MS, rid
        assert abs(e2e - (engine.finished[rid] - engine.arrived[rid])) < MS, rid
        assert 0 <= queue <= ttft
        assert tokens == engine.want[rid] and end == "finished"
        if cause == "gc":
            gc_hit.add(rid)
            assert itl_max >= pause_ns, (rid, itl_max, pause_ns)
    assert gc_hit == in_flight, (gc_hit, in_flight)
    # the stalled step is the run's only slow gc step, and each request's
    # share of it is that step's excess
    assert daemon.query(
        "SELECT count(*), min(gc_ns) >= ? FROM step_attribution WHERE cause = 'gc'", [pause_ns // 2]
    ) == [(1, True)]
    assert daemon.scalar(
        "SELECT count(DISTINCT request_id) FROM request_cause_ns WHERE cause = 'gc'"
    ) >= len(in_flight)
