"""Loads the named SQL views of `queries/` into a DuckDB connection.

Every `.sql` file under the queries directory is executed (in path order,
files that depend on later ones retried until all resolve); each defines
views (`CREATE OR REPLACE VIEW`) and documents them. The directory is the
data package `stallscope.queries` (the repository's `queries/`, in a source
checkout and an install alike), or `$STALLSCOPE_QUERIES`. A file that fails is
reported with its path and the database's message; the other views are still
created. The `fleet/` area is not loaded into a host's database: its views
read the per-host results that export/fleet.py builds from Parquet exports
(`fleet_query_files`).
"""

import importlib.resources
import logging
import os
from pathlib import Path

from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))


def queries_dir():
    """$STALLSCOPE_QUERIES, else the `stallscope.queries` data package."""
    env = os.environ.get("STALLSCOPE_QUERIES")
    if env:
        return Path(env)
    return Path(str(importlib.resources.files("stallscope.queries")))


FLEET_AREA = "fleet"


def query_files():
    """The views of one host's database (every area but fleet/)."""
    root = queries_dir()
    if not root.is_dir():
        return []
    return sorted(
        p for p in root.rglob("*.sql") if p.is_file() and p.relative_to(root).parts[0] != FLEET_AREA
    )


def fleet_query_files():
    """The fleet views (queries/fleet/), over export/fleet.py's fleet_* tables."""
    root = queries_dir() / FLEET_AREA
    return sorted(p for p in root.glob("*.sql") if p.is_file()) if root.is_dir() else []


def create_views(con, files=None):
    """Execute every query file (or `files`); returns the (path, error) failures.

    Files may depend on views of other files: a file that fails is retried
    after the others, pass after pass, until a pass makes no progress."""
    pending = query_files() if files is None else list(files)
    errors = {}
    while pending:
        failed = []
        for path in pending:
            try:
                con.execute(path.read_text())
            except Exception as exc:
                failed.append(path)
                errors[path] = str(exc)
        if len(failed) == len(pending):
            break
        pending = failed
    else:
        return []
    failures = [(str(p), errors[p]) for p in pending]
    for path, err in failures:
        log.error("view file %s failed: %s", path, err)
    return failures
