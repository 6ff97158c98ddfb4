"""A throw-away copy of a database with this checkout's views, for the benches that read one.

A database keeps the views it was written with; the benches that compare
rule variants on stored data (peer_share.py, oncpu_share.py) read a copy
with the views of this checkout applied, and never touch the file given.
"""

import contextlib
import shutil
import tempfile
from pathlib import Path

import duckdb

from stallscope.store.database import apply_schema


@contextlib.contextmanager
def views_on_a_copy(db):
    """A DuckDB connection to a copy of `db` with this checkout's schema and views."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "copy.duckdb"
        shutil.copyfile(db, copy)
        con = duckdb.connect(str(copy))
        try:
            apply_schema(con)
            yield con
        finally:
            con.close()


def role_runs(con, role):
    """The runs that reported `role` (run_events kind 'role': the vLLM preset's 'engine core')."""
    return [
        r
        for (r,) in con.execute(
            "SELECT DISTINCT run_id FROM run_events WHERE kind = 'role' AND message = ?", [role]
        ).fetchall()
    ]
