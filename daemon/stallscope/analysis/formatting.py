"""Renders query results (column names and row tuples) as text.

`format_rows(columns, rows, fmt)` gives an aligned text table ("table"),
CSV ("csv") or JSON lines of objects ("json"); the CLI's `query` command, the
report and the comparison all print through it. It only formats: it never
queries, rounds numbers it was given or drops rows.
"""

import csv
import datetime
import decimal
import io
import json
import math

FORMATS = ("table", "csv", "json")


def _json_value(v):
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, (datetime.date, datetime.datetime, datetime.time, datetime.timedelta)):
        return str(v)
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    return str(v)


def _cell(v):
    """A value as table text: NULL empty, booleans lower case."""
    if v is None:
        return ""
    if v is True:
        return "true"
    if v is False:
        return "false"
    return str(v)  # floats as Python's shortest repr: no rounding here


def _is_number(v):
    return isinstance(v, (int, float, decimal.Decimal)) and not isinstance(v, bool)


def format_table(columns, rows, max_width=None):
    """Aligned columns with a header rule; numbers right-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    if max_width:
        cells = [
            [c if len(c) <= max_width else c[: max_width - 1] + "~" for c in row] for row in cells
        ]
    widths = [len(str(c)) for c in columns]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    numeric = [
        bool(rows) and all(_is_number(r[i]) or r[i] is None for r in rows)
        for i in range(len(columns))
    ]

    def line(values):
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    out = [line([str(c) for c in columns]), "  ".join("-" * w for w in widths)]
    out += [line(row) for row in cells]
    return "\n".join(out) + "\n"


def format_rows(columns, rows, fmt="table"):
    """Rows (sequences, one value per column) as 'table', 'csv' or 'json' text."""
    columns = [str(c) for c in columns]
    rows = [tuple(r) for r in rows]
    if fmt == "table":
        return format_table(columns, rows)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        for row in rows:
            w.writerow(
                [
                    "" if v is None else ("true" if v is True else "false" if v is False else v)
                    for v in row
                ]
            )
        return buf.getvalue()
    if fmt == "json":
        return "".join(
            json.dumps({c: _json_value(v) for c, v in zip(columns, row, strict=True)}) + "\n"
            for row in rows
        )
    raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")


def query_rows(con, sql):
    """(column names, rows) of one query."""
    cur = con.execute(sql)
    return [d[0] for d in cur.description], cur.fetchall()
