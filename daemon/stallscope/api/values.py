"""Python values to and from the API's `Value` message, one way for both sides.

The server sends query results and the client sends query parameters with
`to_value`; both read them back with `from_value`. An integer goes to
`int_value` when it fits 64 signed bits, to `uint_value` when it fits 64
unsigned bits, and otherwise (DuckDB's HUGEINT and UHUGEINT reach 128 bits)
to `string_value` as decimal text, which the proto documents for every type
without a field of its own. Nothing here raises for a value it cannot type:
it becomes text.
"""

from stallscope.api.v1 import stallscope_pb2 as pb

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1


def to_value(v):
    """A pb.Value for a Python value (None, bool, int, float, str, bytes, other)."""
    if v is None:
        return pb.Value(is_null=True)
    if isinstance(v, bool):
        return pb.Value(bool_value=v)
    if isinstance(v, int):
        if _INT64_MIN <= v <= _INT64_MAX:
            return pb.Value(int_value=v)
        if 0 <= v <= _UINT64_MAX:
            return pb.Value(uint_value=v)
        return pb.Value(string_value=str(v))
    if isinstance(v, float):
        return pb.Value(double_value=v)
    if isinstance(v, bytes):
        return pb.Value(bytes_value=v)
    return pb.Value(string_value=str(v))


def from_value(value):
    """The Python value a pb.Value holds (None for SQL NULL)."""
    which = value.WhichOneof("kind")
    if which is None or which == "is_null":
        return None
    return getattr(value, which)
