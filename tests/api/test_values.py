"""One conversion between Python values and the API's Value message, for
the server's results and the client's parameters alike."""

import pytest

from stallscope.api import client, server
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
    assert server.to_value is to_value and client.to_value is to_value
    assert server.from_value is from_value
