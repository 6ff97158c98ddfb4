"""Python values to and from the API's `Value` message, one way for both sides.

The server sends query results and the client sends query parameters with
`to_value`; both read them back with `from_value`. An integer goes to
`int_value` when it fits 64 signed bits, to `uint_value` when it fits 64
unsigned bits, and otherwise (DuckDB's HUGEINT and UHUGEINT reach 128 bits)
to `string_value` as decimal text. Every other type without a field of its
own is text any language can parse, never a Python repr: DECIMAL exact
decimal text, dates and times ISO 8601, and intervals and nested types
(lists, structs, maps, unions) JSON, with the Arrow type deciding how a
map or a dictionary-encoded column reads (`json_ready`). Nothing here
raises for a value it cannot type: it becomes text.
"""

import base64
import datetime as dt
import decimal
import json
import math
import uuid

import pyarrow as pa

from stallscope.api.v1 import stallscope_pb2 as pb

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1
_INTERVAL = type(pa.scalar((1, 2, 3), pa.month_day_nano_interval()).as_py())


def _interval(months, days, nanoseconds):
    return {"months": int(months), "days": int(days), "nanoseconds": int(nanoseconds)}


def json_ready(v, arrow_type=None):
    """`v` as plain JSON data (dict, list, str, int, float, bool, None).

    With `arrow_type` a map becomes [{"key": K, "value": V}, ...] and every
    nested value follows its own field's type; without it, a best guess."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        if math.isfinite(v):
            return v
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    t = arrow_type
    if t is not None:
        if pa.types.is_dictionary(t):
            return json_ready(v, t.value_type)
        if pa.types.is_map(t):
            return [
                {"key": json_ready(k, t.key_type), "value": json_ready(x, t.item_type)}
                for k, x in v
            ]
        if pa.types.is_struct(t):
            return {f.name: json_ready(v.get(f.name), f.type) for f in t}
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            return [json_ready(x, t.value_type) for x in v]
    if isinstance(v, _INTERVAL):
        return _interval(v.months, v.days, v.nanoseconds)
    if isinstance(v, dt.timedelta):
        return _interval(0, v.days, (v.seconds * 1_000_000 + v.microseconds) * 1000)
    if isinstance(v, dict):
        return {str(k): json_ready(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_ready(x) for x in v]
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode("ascii")
    return _text(v)


def _text(v):
    """Scalar text: ISO 8601 for times, exact text for decimals and UUIDs."""
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, (decimal.Decimal, uuid.UUID)):
        return str(v)
    return str(v)


def json_text(v, arrow_type=None):
    """`v` as compact JSON text (see json_ready)."""
    return json.dumps(json_ready(v, arrow_type), separators=(", ", ": "), ensure_ascii=False)


def to_value(v, arrow_type=None):
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
    if isinstance(v, str):
        return pb.Value(string_value=v)
    if isinstance(v, (dt.datetime, dt.date, dt.time, decimal.Decimal, uuid.UUID)):
        return pb.Value(string_value=_text(v))
    return pb.Value(string_value=json_text(v, arrow_type))


def rows_of(batch):
    """pb.Row messages for an Arrow record batch, typed by its schema."""
    cols = []
    for column, field in zip(batch.columns, batch.schema, strict=True):
        t = field.type
        plain = not (pa.types.is_nested(t) or pa.types.is_dictionary(t))
        values = column.to_pylist()
        cols.append([to_value(v) for v in values] if plain else [to_value(v, t) for v in values])
    return [pb.Row(values=list(row)) for row in zip(*cols, strict=True)]


def from_value(value):
    """The Python value a pb.Value holds (None for SQL NULL)."""
    which = value.WhichOneof("kind")
    if which is None or which == "is_null":
        return None
    return getattr(value, which)
