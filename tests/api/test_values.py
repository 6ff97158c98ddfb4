"""One conversion between Python values and the API's Value message, for
the server's results and the client's parameters alike."""

import json

import pytest

from stallscope.api import client, server, status_parts, values
from stallscope.api.values import from_value, to_value


@pytest.mark.parametrize(
    "value, kind",
    [
        (None, "is_null"),
        (True, "bool_value"),
        (-(2**63), "int_value"),
        (2**63 - 1, "int_value"),
        (2**63, "uint_value"),
        (2**64 - 1, "uint_value"),
        (2**64 + 1, "string_value"),
        (-(2**63) - 1, "string_value"),
        (1.5, "double_value"),
        ("x", "string_value"),
        (b"\x00", "bytes_value"),
    ],
)
def test_each_value_takes_its_field(value, kind):
    v = to_value(value)
    assert v.WhichOneof("kind") == kind
    back = from_value(v)
    assert (int(back) if kind == "string_value" and isinstance(value, int) else back) == value


def test_server_and_client_share_the_conversion():
    assert values.rows_of.__globals__["to_value"] is to_value and client.to_value is to_value
    assert server.from_value is from_value


def test_probe_stats_are_json_not_python_reprs():
    class Probe:
        def status(self):
            return {"lost": {"offcpu": 37094}, "attached": True, "poll_ms": 20.0, "tids": [1, 2]}

    from stallscope.api.v1 import stallscope_pb2 as pb

    ps = pb.ProbeState()
    status_parts.set_stats(ps, Probe())
    assert dict(ps.stats) == {
        "lost": '{"offcpu": 37094}',
        "attached": "true",
        "poll_ms": "20.0",
        "tids": "[1, 2]",
    }
    assert json.loads(ps.stats_json) == {
        "lost": {"offcpu": 37094},
        "attached": True,
        "poll_ms": 20.0,
        "tids": [1, 2],
    }
