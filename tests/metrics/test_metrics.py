"""/metrics of a real daemon (bounded labels, counters, errors a user can act
on) and the batch folding on constructed batches with a real store."""

import socket
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from helpers.daemonproc import DaemonProcess
from helpers.prometheus import metrics_port, samples, scrape, total
from helpers.waiting import wait_for
from stallscope.service import selfstats
from stallscope.service.metrics import GC_BUCKETS_S, OTHER, Metrics
from stallscope.store.database import Store

pytestmark = pytest.mark.daemon

ENGINE = Path(__file__).with_name("metrics_engine.py")
MS = 1_000_000
# The only label names /metrics may carry: no pid, tid or run id.
ALLOWED_LABELS = {"run_label", "stage", "generation", "cause", "kind", "where", "reason"}
ALLOWED_LABELS |= {"probe", "backend", "state", "gpu", "label", "le"}
ALLOWED_LABELS |= {"outcome"}  # stallscope_hang_dumps_total: taken, rate_limited, failed


def _engine(d, label, tmp_path):
    stop = tmp_path / f"stop-{label}"
    stop.touch()  # a short run: MIN_STEPS steps, then stop
    return subprocess.run(
        [sys.executable, str(ENGINE), d.socket, label, str(stop), "30"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_run_labels_past_the_limit_fold_into_other_and_no_id_labels(tmp_path):
    d = DaemonProcess(
        tmp_path,
        extra_args=["--metrics-listen", "127.0.0.1:0", "--metrics-max-label-values", "2"],
    ).start()
    try:
        port = metrics_port(d)
        for label in ("first", "second", "third", "fourth"):
            _engine(d, label, tmp_path)

        def counted():
            got = samples(scrape(port))
            return got if total(got, "stallscope_step_duration_seconds_count") == 120 else None

        got = wait_for(counted, 30)
        assert got, scrape(port)
        steps = {}
        for (n, ls), v in got.items():
            if n == "stallscope_step_duration_seconds_count":
                steps[dict(ls)["run_label"]] = steps.get(dict(ls)["run_label"], 0) + v
        assert steps == {"first": 30, "second": 30, OTHER: 60}
        assert total(got, "stallscope_metrics_label_values_folded_total", label="run_label") == 2
        names = {k for _, ls in got for k, _ in ls}
        assert names <= ALLOWED_LABELS, names - ALLOWED_LABELS
        assert total(got, "stallscope_records_received_total") >= 120
        stored = wait_for(
            lambda: total(samples(scrape(port)), "stallscope_rows_stored_total") >= 120, 30
        )
        assert stored, scrape(port)
        assert total(got, "stallscope_records_lost_total") == 0
        assert total(got, "stallscope_daemon_cpu_seconds_total") > 0
        assert total(got, "stallscope_daemon_resident_memory_bytes") > 10 << 20
        assert total(got, "stallscope_probe_state", probe="sched", state="unavailable") == 1
        assert total(got, "stallscope_gc_passes_total", generation="2") >= 4
    finally:
        rc, _ = d.stop()
    assert rc == 0, d.read_log()


def test_a_bad_address_is_refused_before_start(tmp_path):
    d = DaemonProcess(tmp_path, extra_args=["--metrics-listen", "localhost"])
    d.start(wait=False)
    assert d.proc.wait(timeout=60) == 2
    assert "metrics.listen (--metrics-listen) wants HOST:PORT" in d.read_log()


def test_a_port_in_use_is_a_clear_error_and_the_daemon_exits(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        d = DaemonProcess(tmp_path, extra_args=["--metrics-listen", f"127.0.0.1:{port}"])
        d.start(wait=False)
        rc = d.proc.wait(timeout=60)
    assert rc != 0
    assert f"metrics: cannot listen on 127.0.0.1:{port}" in d.read_log()
    assert "Traceback" not in d.read_log()


# ----- folding constructed batches (a real store for the scrape-time reads) ---------


@pytest.fixture
def metrics(tmp_path):
    store = Store(tmp_path / "m.duckdb")
    ingest = types.SimpleNamespace(runs={}, status=lambda: {"records_received": 7})
    daemon = types.SimpleNamespace(store=store, ingest=ingest, probes=[])
    yield Metrics(daemon, max_label_values=3)
    store.close()


def _collect(m):
    out = {}
    for family in m.collect():
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_gc_buckets_put_a_value_on_a_bound_in_that_bound(metrics):
    bound_ns = int(GC_BUCKETS_S[3] * 1e9)  # 0.5 ms
    metrics.on_batch(
        "gc_events",
        pa.table(
            {
                "run_id": [1, 1, 1],
                "generation": pa.array([2, 2, 0], pa.int8()),
                "start_ns": [0, 0, 0],
                "end_ns": [bound_ns, bound_ns + 1, 5_000],
                "collected": [10, None, 1],
            }
        ),
    )
    got = _collect(metrics)
    le = frozenset({("generation", "2"), ("le", repr(GC_BUCKETS_S[3]))})
    below = frozenset({("generation", "2"), ("le", repr(GC_BUCKETS_S[2]))})
    above = frozenset({("generation", "2"), ("le", repr(GC_BUCKETS_S[4]))})
    assert got[("stallscope_gc_pause_seconds_bucket", below)] == 0
    assert got[("stallscope_gc_pause_seconds_bucket", le)] == 1
    assert got[("stallscope_gc_pause_seconds_bucket", above)] == 2
    assert total(got, "stallscope_gc_passes_total", generation="2") == 2
    assert total(got, "stallscope_gc_passes_total", generation="0") == 1
    assert total(got, "stallscope_gc_collected_objects_total", generation="2") == 10


def test_steps_wait_for_their_run_label_and_stages_are_bounded(metrics):
    stages = ["a", "b", "c", "d", "e", "a"]
    spans = pa.table(
        {
            "run_id": [5] * 7,
            "kind": ["step"] * 6 + ["submit"],
            "stage": stages + ["a"],
            "start_ns": [0] * 7,
            "end_ns": [MS] * 7,
        }
    )
    metrics.daemon.ingest.runs[5] = object()  # connected, its row not yet written
    metrics.on_batch("spans", spans)  # before its runs row, as ingest appends them
    assert total(_collect(metrics), "stallscope_step_duration_seconds_count") == 0
    metrics.on_batch("runs", pa.table({"run_id": [5], "label": ["svc"]}))
    got = _collect(metrics)
    count = "stallscope_step_duration_seconds_count"
    assert total(got, count, run_label="svc") == 6  # the submit span is no step
    assert total(got, count, stage="a") == 2
    assert total(got, count, stage=OTHER) == 2  # d and e: past 3 stages
    assert total(got, "stallscope_step_duration_seconds_sum") == pytest.approx(6e-3)


def test_offcpu_by_kind_and_alerts_by_cause(metrics):
    metrics.on_batch(
        "offcpu",
        pa.table(
            {
                "pid": [1, 1, 1],
                "tid": [1, 1, 1],
                "start_ns": [0, 0, 0],
                "end_ns": [2 * MS, 3 * MS, 5 * MS],
                "preempted": [True, False, None],
            }
        ),
    )
    metrics.fold_alerts(pa.table({"cause": ["gc", "gc", "preemption", None]}))
    got = _collect(metrics)
    assert total(got, "stallscope_offcpu_seconds_total", kind="preempted") == pytest.approx(2e-3)
    assert total(got, "stallscope_offcpu_seconds_total", kind="blocked") == pytest.approx(8e-3)
    assert total(got, "stallscope_offcpu_intervals_total", kind="preempted") == 1
    assert total(got, "stallscope_slow_steps_total", cause="gc") == 2
    assert total(got, "stallscope_slow_steps_total", cause="unexplained") == 1
    assert total(got, "stallscope_records_received_total") == 7


def test_gpu_gauges_use_dcgm_names_and_the_latest_sample(metrics):
    metrics.on_batch(
        "nvml_samples",
        pa.table(
            {
                "gpu": [0, 0, 1],
                "ts_ns": [1, 2, 1],
                "sm_clock_mhz": [1980, 1410, 1755],
                "power_mw": pa.array([300_000, None, 150_000], pa.int64()),
                "clock_event_reasons": pa.array([0, 0x4, 0x1], pa.uint64()),
            }
        ),
    )
    got = _collect(metrics)
    assert total(got, "DCGM_FI_DEV_SM_CLOCK", gpu="0") == 1410
    assert total(got, "DCGM_FI_DEV_POWER_USAGE", gpu="0") == 300.0  # the latest known, W
    assert total(got, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu="0") == 4
    assert total(got, "stallscope_gpu_clock_event_reason", gpu="0", reason="sw_power_cap") == 1
    assert total(got, "stallscope_gpu_clock_event_reason", gpu="1", reason="sw_power_cap") == 0
    assert total(got, "stallscope_gpu_clock_event_reason", gpu="1", reason="idle") == 1


def test_selfstats_reads_this_process():
    assert selfstats.rss_bytes() > 1 << 20
    assert selfstats.rss_bytes("/nonexistent") is None
    cpu = selfstats.CpuPercent()
    np.linalg.svd(np.random.default_rng(0).random((300, 300)))  # some CPU
    assert cpu.sample() >= 0


def test_a_run_unknown_to_the_database_gets_an_empty_label(metrics):
    spans = pa.table(
        {"run_id": [9], "kind": ["step"], "stage": [None], "start_ns": [0], "end_ns": [MS]}
    )
    metrics.on_batch("spans", spans)  # no runs row will come, nothing is pending
    assert total(_collect(metrics), "stallscope_step_duration_seconds_count", run_label="") == 1


def test_all_null_columns_are_folded_not_lost(metrics):
    metrics.on_batch(
        "nvml_samples",
        pa.table({"gpu": [0], "sm_clock_mhz": [1500], "power_mw": pa.nulls(1)}),
    )
    got = _collect(metrics)
    assert total(got, "DCGM_FI_DEV_SM_CLOCK", gpu="0") == 1500
    assert not [k for k in got if k[0] == "DCGM_FI_DEV_POWER_USAGE"]


def _events(rows):
    """A request_events batch from (run, request, event, ts_ms) rows."""
    run, rid, event, ts = zip(*rows, strict=True)
    return pa.table(
        {
            "run_id": list(run),
            "request_id": pa.array(rid, pa.uint64()),
            "event": list(event),
            "ts_ns": [round(t * MS) for t in ts],
            "tid": [1] * len(rows),
            "tokens": pa.array([1 if e == "token" else None for e in event], pa.int64()),
            "seq": list(range(len(rows))),
        }
    )


def test_request_ttft_and_itl_histograms_across_batches(metrics):
    metrics.daemon.ingest.runs[7] = object()
    # request 1: arrives at 0, tokens at 30, 40, 45 (gaps 10 and 5), then one
    # more token at 145 in the next batch (gap 100) and finished; request 2
    # has no arrival seen (no TTFT sample), tokens at 10 and 12 (gap 2);
    # rows out of order, as two threads of one run may write them.
    metrics.on_batch("request_events", _events([
        (7, 1, "token", 40), (7, 1, "arrived", 0), (7, 2, "token", 10), (7, 1, "token", 30),
        (7, 1, "scheduled", 1), (7, 1, "token", 45), (7, 2, "token", 12),
    ]))  # fmt: skip
    assert total(_collect(metrics), "stallscope_request_itl_seconds_count") == 0  # label unknown
    metrics.on_batch("runs", pa.table({"run_id": [7], "label": ["svc"]}))
    metrics.on_batch("request_events", _events([(7, 1, "token", 145), (7, 1, "finished", 146)]))
    got = _collect(metrics)
    assert total(got, "stallscope_request_ttft_seconds_count", run_label="svc") == 1
    assert total(got, "stallscope_request_ttft_seconds_sum") == pytest.approx(0.030)
    assert total(got, "stallscope_request_itl_seconds_count", run_label="svc") == 4
    assert total(got, "stallscope_request_itl_seconds_sum") == pytest.approx(0.117)
    le = frozenset({("run_label", "svc"), ("le", repr(0.1))})
    assert got[("stallscope_request_itl_seconds_bucket", le)] == 4  # 100 ms: on the bound
    le = frozenset({("run_label", "svc"), ("le", repr(0.05))})
    assert got[("stallscope_request_itl_seconds_bucket", le)] == 3
    assert (7, 1) not in metrics._requests.open and (7, 2) in metrics._requests.open


def test_itl_by_cause_from_a_real_daemon_names_the_gc_stalled_step(tmp_path):
    """A real daemon with the API and /metrics: the continuous-batching engine
    of tests/spine/test_request_latency.py, one step stalled by a full
    gc.collect() of a large cyclic heap. Every request in flight across that
    step has its gap ending in it counted under cause `gc`, and no other
    gap is (the run's only GC pass)."""
    import gc

    import probe_client
    from spine.test_request_latency import REQUESTS, STALL_STEP, Engine, _cyclic_heap

    d = DaemonProcess(
        tmp_path,
        extra_args=["--metrics-listen", "127.0.0.1:0", "--api-socket", str(tmp_path / "api.sock")],
    ).start()
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        port = metrics_port(d)
        probe = probe_client.connect(socket_path=d.socket, gc=True)
        engine = Engine(probe)
        i, heap = 0, None
        while i < REQUESTS or engine.active or engine.queue:
            for _ in range(2):
                if i < REQUESTS:
                    engine.arrive(1000 + i, 4 + (i * 7) % 9)
                    i += 1
            if engine.steps == STALL_STEP - 1:
                heap = _cyclic_heap(400_000)
                del heap[:]
            engine.step(heap if engine.steps == STALL_STEP else None)
        probe.close()
        _, in_flight = engine.stall
        gaps = sum(engine.want.values()) - REQUESTS  # every token but each first ends a gap
        name = "stallscope_request_itl_by_cause_seconds_count"

        def counted():  # all of them, 5 s after their token
            got = samples(scrape(port))
            return got if total(got, name) == gaps else None

        got = wait_for(counted, 30)
        assert got, scrape(port)
        # (the rest are not_slow, or a loaded machine's preemption: not asserted)
        assert total(got, name, cause="gc") == len(in_flight) >= 4, got
    finally:
        if was:
            gc.enable()
        rc, _ = d.stop()
    assert rc == 0, d.read_log()


def test_itl_by_the_cause_of_the_step_that_served_the_token(metrics):
    """A token gap takes the stall alert's cause of the step (same run and
    thread) its ending token fell in, `not_slow` when no alert came within
    the hold; it is counted only once the hold is over."""
    clock = {"now": 0}
    metrics.follow_alerts(now_ns=lambda: clock["now"])
    metrics.on_batch("runs", pa.table({"run_id": [7], "label": ["svc"]}))
    # request 1: tokens at 10, 20, 130 ms (gaps 10 and 110); request 2:
    # tokens at 20 and 135 ms (gap 115); the step of 100-140 ms on thread 1
    # was slow (gc), so the gaps ending at 130 and 135 ms are gc's
    metrics.on_batch("request_events", _events([
        (7, 1, "token", 10), (7, 1, "token", 20), (7, 2, "token", 20),
        (7, 1, "token", 130), (7, 2, "token", 135),
    ]))  # fmt: skip
    metrics.fold_alerts(pa.table({"run_id": [7], "tid": [1], "start_ns": [100 * MS],
                                  "end_ns": [140 * MS], "cause": ["gc"]}))  # fmt: skip
    name = "stallscope_request_itl_by_cause_seconds_count"
    assert total(_collect(metrics), name) == 0  # still waiting for alerts
    clock["now"] = 136 * MS + 5_000_000_000
    got = _collect(metrics)
    assert total(got, name, cause="gc") == 2
    assert total(got, name, cause="not_slow") == 1
    assert total(got, "stallscope_request_itl_by_cause_seconds_sum", cause="gc") == (
        pytest.approx(0.225)
    )
    # a gap on another thread is not that step's, whatever its time
    metrics.on_batch("request_events", pa.table({
        "run_id": [7, 7], "request_id": pa.array([3, 3], pa.uint64()), "event": ["token"] * 2,
        "ts_ns": [110 * MS, 120 * MS], "tid": [2, 2], "tokens": pa.array([1, 1], pa.int64()),
        "seq": [0, 1]}))  # fmt: skip
    assert total(_collect(metrics), name, cause="not_slow") == 2


def test_without_alerts_no_itl_by_cause_is_kept(metrics):
    metrics.on_batch("request_events", _events([(7, 1, "token", 10), (7, 1, "token", 20)]))
    assert metrics._itl_by_cause is None
    assert total(_collect(metrics), "stallscope_request_itl_by_cause_seconds_count") == 0


def test_histograms_and_request_feed_share_one_fold(tmp_path, monkeypatch):
    """With /metrics and the API both on, each request_events batch is folded
    once (the daemon's RequestFolder) and both readers get what it gave: the
    histograms their samples, the feed its ended requests; a reader that
    closed gets nothing more, the other still does."""
    from stallscope.store import request_ends

    folds = []
    real_fold = request_ends.RequestEnds.fold
    monkeypatch.setattr(
        request_ends.RequestEnds, "fold", lambda self, b: folds.append(b) or real_fold(self, b)
    )
    store = Store(tmp_path / "m.duckdb")
    try:
        ingest = types.SimpleNamespace(runs={7: object()}, status=lambda: {})
        daemon = types.SimpleNamespace(store=store, ingest=ingest, probes=[])
        folder = request_ends.RequestFolder()
        finished = []
        fanout = types.SimpleNamespace(on_batch=lambda table, b: finished.append(b.to_pylist()))
        feed = request_ends.RequestFinishedFeed(fanout, folder)
        metrics = Metrics(daemon, max_label_values=3, folder=folder)
        for listener in (metrics.on_batch, feed.on_batch, folder.on_batch):  # the store's order
            listener("runs", pa.table({"run_id": [7], "label": ["svc"]}))
        one = _events([(7, 1, "arrived", 0), (7, 1, "token", 30), (7, 1, "token", 40)])
        two = _events([(7, 1, "token", 45), (7, 1, "finished", 50)])
        for batch in (one, two):
            for listener in (metrics.on_batch, feed.on_batch, folder.on_batch):
                listener("request_events", batch)
        assert len(folds) == 2  # once per batch, not once per reader
        got = _collect(metrics)
        assert total(got, "stallscope_request_ttft_seconds_count", run_label="svc") == 1
        assert total(got, "stallscope_request_itl_seconds_count", run_label="svc") == 2
        ((end,),) = finished
        assert (end["request_id"], end["ttft_ns"], end["e2e_ns"]) == (1, 30 * MS, 50 * MS)
        metrics.close()
        folder.on_batch("request_events", _events([(7, 2, "token", 60), (7, 2, "aborted", 61)]))
        assert len(finished) == 2 and len(folds) == 3
        assert total(_collect(metrics), "stallscope_request_itl_seconds_count") == 2
        feed.close()
        folder.on_batch("request_events", _events([(7, 3, "token", 70)]))
        assert len(folds) == 3  # no reader left: nothing folded
    finally:
        store.close()
