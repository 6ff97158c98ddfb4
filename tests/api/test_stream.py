"""StreamEvents end to end: probe client -> daemon -> gRPC subscriber (Unix socket)."""

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import pytest

import probe_client
from helpers.api import stop
from helpers.waiting import wait_for
from stallscope.api.client import Client
from stallscope.api.v1 import stallscope_pb2 as pb

pytestmark = pytest.mark.daemon


class Collector:
    """Reads one stream on a thread and keeps every event."""

    def __init__(self, stream):
        self.stream = stream
        self.events = []
        self.error = None
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            for batch in self.stream:
                with self._lock:
                    self.events.extend(batch.events)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.error = exc

    def of(self, which):
        with self._lock:
            return [getattr(e, which) for e in self.events if e.WhichOneof("payload") == which]

    def close(self):
        self.stream.cancel()
        self.thread.join(5)


def _subscribed(client):
    """Wait until the daemon counts the stream (the request reached the server)."""
    n = client.status().subscribers
    return lambda: client.status().subscribers > n


def _run_id(client, label):
    runs = wait_for(lambda: [r for r in client.runs() if r.label == label])
    assert runs, f"run {label} never appeared"
    return runs[0].run_id


def test_probe_events_reach_a_subscriber(api_daemon, client):
    check = _subscribed(client)
    col = Collector(client.events())
    assert wait_for(check)
    probe = probe_client.connect(socket_path=api_daemon.socket, run_label="reach", gc=True)
    n = 300
    for i in range(n):
        t0 = probe.begin()
        probe.end("step", t0, stage=("prefill", "recurrent")[i % 2], batch=i % 5)
    gc.collect(0)
    gc.collect(2)
    probe.close()
    assert wait_for(lambda: len(col.of("span")) >= n and len(col.of("gc_pass")) >= 2)
    col.close()
    spans = col.of("span")
    assert len(spans) == n
    assert sorted(s.seq for s in spans if s.kind == "step") == sorted(s.seq for s in spans)
    assert {s.pid for s in spans} == {os.getpid()}
    assert [(s.stage, s.batch) for s in sorted(spans, key=lambda s: s.seq)] == [
        (("prefill", "recurrent")[i % 2], i % 5) for i in range(n)
    ]
    assert all(s.duration_ns == s.end_ns - s.start_ns >= 0 for s in spans)
    gens = [g.generation for g in col.of("gc_pass")]
    assert 0 in gens and 2 in gens
    # every event numbered once, in order, no gap (nothing was dropped)
    seqs = [e.seq for e in col.events]
    assert seqs == list(range(len(seqs)))
    assert not col.of("dropped")
    assert col.error is None


CHILD = textwrap.dedent("""
    import sys, time, probe_client
    probe = probe_client.connect(socket_path=sys.argv[1], run_label="child", gc=False)
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(50):
        t0 = probe.begin()
        probe.end("step", t0, stage="child", batch=1)
    probe.close()
    print("done", flush=True)
""")


def test_filters_hold(api_daemon, client):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, api_daemon.socket],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        a = probe_client.connect(socket_path=api_daemon.socket, run_label="a", gc=False)
        b = probe_client.connect(socket_path=api_daemon.socket, run_label="b", gc=False)
        run_a, run_b = _run_id(client, "a"), _run_id(client, "b")
        assert run_a != run_b
        check = _subscribed(client)
        by_run = Collector(client.events(run_ids=[run_a]))
        by_pid = Collector(client.events(pids=[child.pid]))
        gc_only = Collector(client.events(kinds=[pb.GC_PASS]))
        long_submits = Collector(client.events(span_kinds=["submit"], min_duration_ns=5_000_000))
        assert wait_for(lambda: client.status().subscribers >= 4)
        assert check()
        for i in range(40):
            for probe, stage in ((a, "a"), (b, "b")):
                t0 = probe.begin()
                probe.end("step", t0, stage=stage, batch=i)
                # submit spans: every other one 10 ms long (t0 moved back)
                long = i % 2 == 0
                probe.end("submit", probe.begin() - (10_000_000 if long else 0), stage=stage)
        a.close()
        b.close()
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
        # gc passes from this process's own client would come through the gc filter
        probe_gc = probe_client.connect(socket_path=api_daemon.socket, run_label="g", gc=True)
        gc.collect(1)
        probe_gc.close()

        assert wait_for(
            lambda: (
                len(by_pid.of("span")) >= 50
                and len(by_run.of("span")) >= 80
                and len(long_submits.of("span")) >= 40
                and gc_only.of("gc_pass")
            )
        )
        time.sleep(0.5)  # anything that should not arrive has had time to
        for col in (by_run, by_pid, gc_only, long_submits):
            col.close()
            assert col.error is None
        assert {s.run_id for s in by_run.of("span")} == {run_a}
        assert len(by_run.of("span")) == 80  # 40 steps + 40 submits of run a
        assert {s.pid for s in by_pid.of("span")} == {child.pid}
        assert {s.stage for s in by_pid.of("span")} == {"child"}
        assert len(by_pid.of("span")) == 50
        assert not gc_only.of("span") and gc_only.of("gc_pass")
        assert {e.WhichOneof("payload") for e in gc_only.events} == {"gc_pass"}
        subs = long_submits.of("span")
        assert len(subs) == 40  # 20 long submits from each of a and b
        assert all(s.kind == "submit" and s.duration_ns >= 5_000_000 for s in subs)
    finally:
        child.kill()
        child.wait()


def test_stalled_subscriber_loses_events_and_is_told(api_daemon, client):
    # The stalled client keeps HTTP/2's flow-control window small so that the
    # server's writes block soon after it stops reading.
    slow_client = Client(api_daemon.api_socket, channel_options=[("grpc.http2.bdp_probe", 0)])
    check = _subscribed(client)
    fast = Collector(client.events(kinds=[pb.SPAN]))
    assert wait_for(check)
    # The slow stream must be counted before the warm span is sent: a span
    # published before its subscription reaches the server is not its to
    # see, and next(slow) below would wait forever (seen once in CI).
    check = _subscribed(client)
    slow = slow_client.events(kinds=[pb.SPAN], max_queue_events=1000)
    assert wait_for(check)
    slow_first = []
    # Take one message so the stream is established, then stop reading.
    probe = probe_client.connect(socket_path=api_daemon.socket, run_label="stall", gc=False)
    t0 = probe.begin()
    probe.end("step", t0, stage="warm", batch=0)
    probe.flush()
    slow_first.extend(next(slow).events)
    assert client.status().subscribers >= 2

    n = 20_000
    for i in range(n):
        t0 = probe.begin()
        probe.end("step", t0, stage="load", batch=i % 8)
        if i % 200 == 199:
            time.sleep(0.01)  # ~20k records/s: well inside what ingest takes
    probe.close()
    # What the client managed to send (drops in the client's own socket, if the
    # machine is very busy, are the client's and stored as losses): the fast
    # subscriber and the database must have all of it.
    sent = probe.stats()["sent_records"]
    assert sent > n // 2

    assert wait_for(lambda: len(fast.of("span")) >= sent, timeout_s=30)
    assert wait_for(lambda: client.status().stream_events_dropped > 0)
    status = client.status()
    fast.close()
    fast_spans = fast.of("span")
    assert len(fast_spans) == sent and not fast.of("dropped")
    assert len({s.seq for s in fast_spans}) == sent

    # Now the slow one reads: what it got plus what it was told it lost is everything.
    got = [e for e in slow_first if e.HasField("span")]
    dropped = []
    in_order = list(slow_first)  # every event, as the stream numbered it
    deadline = time.monotonic() + 30
    for batch in slow:
        for e in batch.events:
            in_order.append(e)
            if e.HasField("span"):
                got.append(e)
            elif e.HasField("dropped"):
                dropped.append(e.dropped)
        if len(got) + sum(d.count for d in dropped) >= sent or time.monotonic() > deadline:
            break
    slow.cancel()
    slow_client.close()
    assert dropped, "the stalled subscriber was never told it lost events"
    assert all(d.reason == "subscriber_queue_full" for d in dropped)
    assert dropped[-1].total == sum(d.count for d in dropped)
    assert len(got) + dropped[-1].total == sent
    assert len(got) < sent
    assert status.stream_events_dropped >= dropped[-1].total
    # seq numbers stay gap-free, Dropped notices included: a drop is told in
    # its place, not hidden in a gap
    seqs = [e.seq for e in in_order]
    assert seqs == list(range(len(seqs)))
    # Each notice sits where the loss happened: the spans before it ended
    # before its range, the spans after it start after it (one thread's steps
    # are sequential), and its range holds exactly the events it counts, so
    # a Query on it backfills the hole.
    stop(api_daemon)
    for i, e in enumerate(in_order):
        if not e.HasField("dropped"):
            continue
        d = e.dropped
        assert list(d.kinds) == [pb.SPAN] and 0 < d.from_ns <= d.to_ns
        before = [x.span for x in in_order[:i] if x.HasField("span") and x.span.stage == "load"]
        after = [x.span for x in in_order[i + 1 :] if x.HasField("span")]
        if before:
            assert before[-1].end_ns <= d.from_ns
        if after:
            assert d.to_ns <= after[0].start_ns
        backfill = api_daemon.scalar(
            "SELECT count(*) FROM spans WHERE start_ns >= ? AND end_ns <= ?", [d.from_ns, d.to_ns]
        )
        assert backfill == d.count
    assert api_daemon.scalar("SELECT count(*) FROM spans") == sent
    assert api_daemon.scalar("SELECT coalesce(sum(count), 0) FROM losses") == 1 + n - sent


def test_stall_alert_carries_gc_overlap(api_daemon, client):
    check = _subscribed(client)
    col = Collector(client.events(kinds=[pb.STALL_ALERT]))
    assert wait_for(check)
    probe = probe_client.connect(socket_path=api_daemon.socket, run_label="alert", gc=True)
    gc.disable()  # only the collection we start may run inside a step
    try:
        for _ in range(30):
            t0 = probe.begin()
            time.sleep(0.003)
            probe.end("step", t0, stage="recurrent", batch=4)
        junk = []
        for _ in range(300_000):  # cyclic garbage: a gen-2 pass that takes a while
            x = []
            x.append(x)
            junk.append(x)
        del junk, x
        t0 = probe.begin()
        time.sleep(0.003)
        gc.collect(2)
        probe.end("step", t0, stage="recurrent", batch=4)
    finally:
        gc.enable()
    probe.close()
    alerts = wait_for(lambda: [a for a in col.of("stall_alert") if a.gc_overlap_ns > 0])
    col.close()
    assert alerts, f"no alert with GC overlap; got {col.of('stall_alert')}"
    a = alerts[-1]
    assert a.stage == "recurrent" and a.batch == 4 and a.pid == os.getpid()
    assert a.gc_generation == 2 and a.cause == "gc"
    assert a.duration_ns > 1.2 * a.baseline_ns and a.ratio > 1.2
    assert a.gc_overlap_ns <= a.duration_ns


def test_request_finished_carries_the_requests_latency(api_daemon, client):
    """Each request a client ends comes as one RequestFinished event with the
    latency its own clock gave; a request still open sends none."""
    check = _subscribed(client)
    col = Collector(client.events(kinds=[pb.REQUEST_FINISHED]))
    assert wait_for(check)
    probe = probe_client.connect(socket_path=api_daemon.socket, run_label="requests", gc=False)
    arrival, first, ends = {}, {}, {}
    for r in range(20):
        rid = f"req-{r}" if r % 2 else r
        arrival[r] = time.monotonic_ns()
        probe.request(rid, "arrived")
        for _ in range(3 + r % 4):
            time.sleep(0.001)
            first.setdefault(r, time.monotonic_ns())
            probe.request(rid, "token", tokens=2)
        ends[r] = time.monotonic_ns()
        probe.request(rid, "aborted" if r == 7 else "finished")
    probe.request(99, "arrived")  # never ends
    probe.close()
    assert wait_for(lambda: len(col.of("request_finished")) >= 20)
    time.sleep(0.3)
    col.close()
    got = col.of("request_finished")
    assert len(got) == 20, [e.request_id for e in got]
    by_key = {(e.text or e.request_id): e for e in got}
    run_id = _run_id(client, "requests")
    for r in range(20):
        e = by_key[f"req-{r}" if r % 2 else r]
        assert (e.run_id, e.pid) == (run_id, os.getpid())
        assert e.end_event == ("aborted" if r == 7 else "finished")
        assert e.output_tokens == 2 * (3 + r % 4)
        # the events' times are the client's, taken inside the calls just after these
        assert abs(e.ttft_ns - (first[r] - arrival[r])) < 2_000_000, (r, e)
        assert abs(e.e2e_ns - (ends[r] - arrival[r])) < 2_000_000, (r, e)
        assert e.itl_max_ns >= 1_000_000 and e.arrival_ns >= arrival[r]
