"""On SIGTERM the API says so: Health.Watch turns NOT_SERVING before the end,
and an open StreamEvents ends with UNAVAILABLE (not OK, which would read as
"the stream is complete")."""

import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from helpers.api import start_api_daemon
from helpers.waiting import wait_for
from stallscope.api.client import Client
from stallscope.api.v1 import stallscope_pb2 as pb
from stallscope.api.v1 import stallscope_pb2_grpc as pb_grpc

pytestmark = pytest.mark.daemon


def test_sigterm_reports_not_serving_then_ends_streams_unavailable(tmp_path):
    d = start_api_daemon(tmp_path)
    client = Client(d.api_socket)
    client.wait_ready()
    watched, stream_end = [], {}
    health = health_pb2_grpc.HealthStub(client.channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(service="stallscope.v1.Stallscope"))
    stub = pb_grpc.StallscopeStub(client.channel)
    events = stub.StreamEvents(pb.StreamEventsRequest(kinds=[pb.SPAN]))

    def follow_watch():
        try:
            for reply in watch:
                watched.append(reply.status)
        except grpc.RpcError:
            pass

    def follow_stream():
        try:
            for _ in events:
                pass
            stream_end["code"] = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            stream_end["code"] = exc.code()
            stream_end["details"] = exc.details()

    threads = [threading.Thread(target=f, daemon=True) for f in (follow_watch, follow_stream)]
    for t in threads:
        t.start()
    try:
        assert wait_for(lambda: health_pb2.HealthCheckResponse.SERVING in watched)
        assert wait_for(lambda: d.read_log().count("event stream opened") >= 1)
        rc, _ = d.stop()
        assert rc == 0, d.read_log()
        for t in threads:
            t.join(timeout=10)
    finally:
        client.close()
        if d.proc.poll() is None:
            d.kill()
    assert health_pb2.HealthCheckResponse.NOT_SERVING in watched, watched
    assert stream_end.get("code") == grpc.StatusCode.UNAVAILABLE, stream_end
    assert "shutting down" in stream_end.get("details", "")
