"""Rows as an aligned text table, CSV or JSON (for `stallscope query`)."""

import csv
import io
import json


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def format_rows(columns, rows, fmt="table"):
    """Render rows; `fmt` is 'table', 'csv' or 'json' (one object per row)."""
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if v is None else v for v in row])
        return out.getvalue()
    if fmt == "json":
        return "".join(json.dumps(dict(zip(columns, row)), default=str) + "\n" for row in rows)
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in rows) and rows
               for i in range(len(columns))]

    def line(values):
        return "  " + "  ".join(v.rjust(w) if num else v.ljust(w)
                                for v, w, num in zip(values, widths, numeric)).rstrip() + "\n"
    out = [line(columns), "  " + "  ".join("-" * w for w in widths) + "\n"]
    out.extend(line(r) for r in cells)
    return "".join(out)
