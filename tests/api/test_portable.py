"""What a client in another language needs from the API, against a real daemon:
reflection under grpc.reflection.v1 as well as v1alpha, a wall-clock anchor in
GetStatus, host and realtime start per run, ListRuns in pages."""

import socket
import time

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2

import probe_client
from helpers.waiting import wait_for
from stallscope.api.v1 import stallscope_pb2 as pb

pytestmark = pytest.mark.daemon


def _reflect(channel, service, request):
    """One reflection exchange on `service`, raw (v1 and v1alpha share bytes)."""
    call = channel.stream_stream(
        f"/{service}/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    return list(call(iter([request]), timeout=10))[0]


def test_reflection_answers_v1_and_v1alpha(client):
    for service in (
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ):
        names = {
            s.name
            for s in _reflect(
                client.channel, service, reflection_pb2.ServerReflectionRequest(list_services="")
            ).list_services_response.service
        }
        assert {
            "stallscope.v1.Stallscope",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        } <= names
        answer = _reflect(
            client.channel,
            service,
            reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="stallscope.v1.Stallscope"
            ),
        )
        files = [
            descriptor_pb2.FileDescriptorProto.FromString(b)
            for b in answer.file_descriptor_response.file_descriptor_proto
        ]
        assert any(f.package == "stallscope.v1" for f in files)
    # reflection describes itself under the new name too (grpcurl describe)
    answer = _reflect(
        client.channel,
        "grpc.reflection.v1.ServerReflection",
        reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="grpc.reflection.v1.ServerReflection"
        ),
    )
    f = descriptor_pb2.FileDescriptorProto.FromString(
        answer.file_descriptor_response.file_descriptor_proto[0]
    )
    assert f.package == "grpc.reflection.v1" and f.service[0].name == "ServerReflection"


def test_status_gives_the_wall_clock_anchor_and_host(client):
    before = time.time_ns() - time.monotonic_ns()
    st = client.status()
    after = time.time_ns() - time.monotonic_ns()
    # same host, same clocks: the daemon's offset lies between two of ours
    # (give or take the reads' own spacing)
    assert before - 5_000_000 <= st.realtime_offset_ns <= after + 5_000_000
    assert st.monotonic_ns > 0 and st.host == socket.gethostname()


def test_runs_carry_host_and_realtime_start_and_page(api_daemon, client):
    for i in range(5):
        probe = probe_client.connect(socket_path=api_daemon.socket, run_label=f"r{i}", gc=False)
        t0 = probe.begin()
        probe.end("step", t0, stage="s", batch=1)
        probe.close()
    assert wait_for(lambda: len(client.stub.ListRuns(pb.ListRunsRequest()).runs) == 5)
    everything = client.stub.ListRuns(pb.ListRunsRequest()).runs
    assert [r.label for r in everything] == ["r4", "r3", "r2", "r1", "r0"]
    assert not client.stub.ListRuns(pb.ListRunsRequest()).next_page_token
    now_real = time.time_ns()
    for r in everything:
        assert r.host == socket.gethostname()
        assert now_real - 120 * 10**9 < r.realtime_start_ns <= now_real
    pages, token = [], ""
    while True:
        resp = client.stub.ListRuns(pb.ListRunsRequest(page_size=2, page_token=token))
        pages.append([r.label for r in resp.runs])
        token = resp.next_page_token
        if not token:
            break
    assert pages == [["r4", "r3"], ["r2", "r1"], ["r0"]]
    try:
        client.stub.ListRuns(pb.ListRunsRequest(page_token="not-a-token"))
        raise AssertionError("a bad page token was accepted")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "page_token" in exc.details()
