"""Kernel and GPU events through the real server and store, without root or a GPU.

The scheduling and GPU probes need privileges or hardware; what the API does
with their batches does not. Here a real Store and a real gRPC server on a
Unix socket get batches exactly as probes append them (`store.append`), and a
real client checks what comes out, filters included.
"""

import threading
import types

import numpy as np
import pytest

from helpers.waiting import wait_for
from stallscope.api.client import Client
from stallscope.api.server import start_api_server
from stallscope.api.v1 import stallscope_pb2 as pb
from stallscope.store.database import Store
from stallscope.store.fanout import Fanout


class FakeIngest:
    def __init__(self):
        self.runs_by_token = {7: types.SimpleNamespace(run_id=3, pid=4100)}
        self.runs = {3: self.runs_by_token[7]}

    def status(self):
        return {"records_received": 0, "lost_records": 0, "rejections": {}}


def serve(daemon, api_socket):
    """The API over the store's live fan-out, wired as the service wires it."""
    fanout = Fanout(lambda: {r.run_id: r.pid for r in daemon.ingest.runs.values()})
    daemon.store.add_listener(fanout.on_batch)
    return start_api_server(daemon, api_socket, fanout)


@pytest.fixture
def served(tmp_path):
    store = Store(str(tmp_path / "k.duckdb"), flush_interval_s=0.05)
    store.start()
    daemon = types.SimpleNamespace(store=store, ingest=FakeIngest(), probes=[], started_ns=0)
    api = serve(daemon, str(tmp_path / "api.sock"))
    client = Client(str(tmp_path / "api.sock"))
    client.wait_ready()
    yield store, client, api
    client.close()
    api.stop(grace=0.2)
    store.close()


def collect(stream, until):
    got = []

    def run():
        try:
            for batch in stream:
                got.extend(batch.events)
        except Exception:
            pass

    threading.Thread(target=run, daemon=True).start()
    assert wait_for(lambda: until(got)), got
    stream.cancel()
    return got


def test_kernel_and_gpu_batches_become_events_and_filters_hold(served):
    store, client, api = served
    assert api.live_subscribers() == 0
    everything = client.events()
    by_run = client.events(run_ids=[3])  # run 3 is pid 4100
    long_offcpu = client.events(kinds=[pb.OFF_CPU], min_duration_ns=1000)
    assert wait_for(lambda: client.status().subscribers == 3)
    assert api.live_subscribers() == 3
    store.append(
        "offcpu",
        {
            "pid": np.array([4100, 4100, 999], np.int32),
            "tid": np.array([4101, 4102, 1000], np.int32),
            "start_ns": np.array([100, 200, 300]),
            "end_ns": np.array([5100, 250, 9300]),
            "preempted": [True, False, None],
            "cpu": [0, 1, None],
        },
    )
    store.append(
        "runq",
        {
            "pid": np.array([4100], np.int32),
            "tid": np.array([4101], np.int32),
            "start_ns": np.array([10]),
            "end_ns": np.array([40]),
            "cpu": np.array([1], np.int16),
        },
    )
    store.append(
        "migrations",
        {
            "pid": np.array([999, 4100], np.int32),
            "tid": np.array([1000, 4101], np.int32),
            "ts_ns": np.array([7, 8]),
            "from_cpu": [0, 1],
            "to_cpu": [1, 0],
        },
    )
    store.append(
        "nvml_samples",
        {
            "gpu": [0],
            "ts_ns": [55],
            "sm_clock_mhz": [1980],
            "mem_clock_mhz": [3201],
            "power_mw": [None],
            "temp_c": [41],
            "util_pct": [97],
            "clock_event_reasons": np.array([0x4], np.uint64),
            "source": ["poll"],
        },
    )
    store.append("probe_status", {"ts_ns": [1], "probe": ["x"]})  # not a streamed table

    ev = collect(everything, lambda g: len(g) >= 7)
    kinds = sorted(e.WhichOneof("payload") for e in ev)
    assert kinds == [
        "gpu_sample",
        "migration",
        "migration",
        "off_cpu",
        "off_cpu",
        "off_cpu",
        "run_queue",
    ]
    off = {e.off_cpu.tid: e.off_cpu for e in ev if e.HasField("off_cpu")}
    assert off[4101].duration_ns == 5000 and off[4101].preempted and off[4101].cpu == 0
    assert off[1000].cpu == -1 and not off[1000].preempted  # NULL -> documented
    gpu = next(e.gpu_sample for e in ev if e.HasField("gpu_sample"))
    assert (gpu.sm_clock_mhz, gpu.power_mw, gpu.clock_event_reasons, gpu.source) == (
        1980,
        -1,
        4,
        "poll",
    )

    ev = collect(by_run, lambda g: len(g) >= 4)
    assert {e.WhichOneof("payload") for e in ev} == {
        "off_cpu",
        "run_queue",
        "migration",
        "gpu_sample",
    }
    assert all(
        getattr(e, e.WhichOneof("payload")).pid == 4100 for e in ev if not e.HasField("gpu_sample")
    )
    ev = collect(long_offcpu, lambda g: len(g) >= 2)
    assert sorted(e.off_cpu.tid for e in ev) == [1000, 4101]  # the 50 ns one is filtered

    store.flush()
    cols, rows = client.query("SELECT count(*) FROM offcpu")
    assert rows == [(3,)]


def test_a_batch_missing_a_column_streams_on_and_is_counted(served):
    """A producer that disagrees with the schema (no `to_cpu` in a migrations
    batch) does not stop the stream nor pass as zeros unnoticed: the events
    go out with unknown values and GetStatus counts the column."""
    store, client, api = served
    stream = client.events(kinds=[pb.MIGRATION])
    assert wait_for(lambda: client.status().subscribers == 1)
    store.append(
        "migrations",
        {"pid": [4100], "tid": [4101], "ts_ns": [7], "from_cpu": [1]},
    )
    store.append(
        "migrations",
        {"pid": [4100], "tid": [4101], "ts_ns": [9], "from_cpu": [0], "to_cpu": [1]},
    )
    ev = collect(stream, lambda g: len(g) >= 2)
    assert [(e.migration.ts_ns, e.migration.to_cpu) for e in ev] == [(7, -1), (9, 1)]
    assert dict(client.status().stream_missing_columns) == {"MIGRATION.to_cpu": 1}


def test_query_refuses_to_run_on_an_unsandboxed_database(tmp_path):
    import grpc

    from stallscope.api.client import ApiError

    store = Store(str(tmp_path / "open.duckdb"), sandbox=False)
    store.start()
    daemon = types.SimpleNamespace(store=store, ingest=FakeIngest(), probes=[], started_ns=0)
    api = serve(daemon, str(tmp_path / "api.sock"))
    client = Client(str(tmp_path / "api.sock"))
    try:
        with pytest.raises(ApiError) as info:
            client.query("SELECT 1")
        assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "not sandboxed" in str(info.value)
        assert client.status().db_path == store.path  # the rest of the API still serves
    finally:
        client.close()
        api.stop(grace=0.2)
        store.close()
