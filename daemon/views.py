"""Loads the named SQL views of `queries/` into a DuckDB connection.

Every `.sql` file under the queries directory (in path order) is executed;
each defines views (`CREATE OR REPLACE VIEW`) and documents them. The
directory is the repository's `queries/`, or `$STALLSCOPE_QUERIES`. A file
that fails is reported with its path and the database's message; the other
views are still created.
"""

import logging
import os
from pathlib import Path

log = logging.getLogger("stallscope.views")


def queries_dir():
    env = os.environ.get("STALLSCOPE_QUERIES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "queries"


def query_files():
    root = queries_dir()
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*.sql") if p.is_file())


def create_views(con):
    """Execute every query file; returns the list of (path, error) failures."""
    failures = []
    for path in query_files():
        try:
            con.execute(path.read_text())
        except Exception as exc:
            failures.append((str(path), str(exc)))
            log.error("view file %s failed: %s", path, exc)
    return failures
