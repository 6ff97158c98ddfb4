"""Creates the schema and carries a database written by an older release forward.

Two kinds of change, both applied when the daemon (or a test) opens a file:
- additive ones live in `schema/NNN_*.sql`, written to be re-run on every
  open (`CREATE TABLE IF NOT EXISTS`, `ALTER TABLE ... ADD COLUMN IF NOT
  EXISTS`), so a new table or column reaches an old file for free;
- everything else (a changed type, a backfill, a moved column) is a numbered
  migration, `schema/migrations/NNN_name.sql`, applied once, in order, each in
  its own transaction, and recorded in `schema_version`.

`SCHEMA_VERSION` is the number of the newest migration this release knows.
A database whose recorded version is newer (written by a newer daemon) is
refused with `SchemaVersionError` before anything is written to it: a daemon
must never half-understand a file. The named views are created last, after
every table exists. Creating them costs ~0.7 s (DuckDB binds each view), so
a file records the fingerprint of what built it (the schema and migration
files, the view files, the DuckDB version) in `_schema_fingerprint`, and an
open whose fingerprint matches has nothing to do. Nothing here runs per
record.
"""

import hashlib
import logging
import re
import time
from pathlib import Path

from stallscope.errors import SchemaVersionError
from stallscope.store import views
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

SCHEMA_DIR = Path(__file__).resolve().parent / "schema"
MIGRATIONS_DIR = SCHEMA_DIR / "migrations"

# The release that first recorded a schema version. A file without a
# `schema_version` table was written by the first release (version 0).
_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER,   -- migration number applied (0: the first release's schema)
    applied_ns BIGINT,    -- CLOCK_REALTIME ns when it was applied
    name       VARCHAR    -- migration file name, or 'base'
);
"""


_CREATE_TABLE = re.compile(
    r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)\s*\((.*?)\n\);", re.S | re.I
)
_ADD_STORED_NS = re.compile(
    r"ALTER\s+TABLE\s+(\w+)\s+ADD\s+COLUMN\s+(?:IF\s+NOT\s+EXISTS\s+)?stored_ns\b", re.I
)


def stored_tables(schema_dir=None):
    """The tables that carry `stored_ns` (what the Parquet export sends), in
    schema order: read from the schema files, so no list repeats them."""
    found = []
    for path in sorted((schema_dir or SCHEMA_DIR).glob("*.sql")):
        text = re.sub(r"--[^\n]*", "", path.read_text())
        hits = [
            (m.start(), m.group(1))
            for m in _CREATE_TABLE.finditer(text)
            if re.search(r"^\s*stored_ns\s", m.group(2), re.M)
        ]
        hits += [(m.start(), m.group(1)) for m in _ADD_STORED_NS.finditer(text)]
        for _, table in sorted(hits):
            if table not in found:
                found.append(table)
    return tuple(found)


def migrations():
    """(number, path) of every migration file, in order."""
    found = []
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        m = re.match(r"(\d+)_", path.name)
        if m:
            found.append((int(m.group(1)), path))
    numbers = [n for n, _ in found]
    if len(set(numbers)) != len(numbers):
        raise RuntimeError(f"duplicate migration numbers in {MIGRATIONS_DIR}")
    return found


SCHEMA_VERSION = max((n for n, _ in migrations()), default=0)


def recorded_version(con):
    """The newest migration recorded in the file, or None for a new file."""
    has_table = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'schema_version'"
    ).fetchone()[0]
    if not has_table:
        has_runs = con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'runs'"
        ).fetchone()[0]
        return 0 if has_runs else None
    return con.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]


_FINGERPRINT_TABLE = """
CREATE TABLE IF NOT EXISTS _schema_fingerprint (
    fingerprint VARCHAR,  -- of the files and DuckDB release that built this schema and its views
    objects     INTEGER,  -- views and macros they made (one dropped since: not current)
    applied_ns  BIGINT    -- CLOCK_REALTIME ns
);
"""
_OBJECTS = (
    "SELECT (SELECT count(*) FROM duckdb_views() WHERE NOT internal AND schema_name = 'main')"
    " + (SELECT count(*) FROM duckdb_functions() WHERE NOT internal AND schema_name = 'main'"
    " AND function_type IN ('macro', 'table_macro'))"
)


def fingerprint(view_files=None):
    """What the schema and views of a file built now depend on: every schema
    and migration file, every view file (names and contents) and DuckDB's
    version (views are stored bound to its catalog)."""
    import duckdb

    h = hashlib.sha256(duckdb.__version__.encode())
    files = sorted(SCHEMA_DIR.glob("*.sql")) + [p for _, p in migrations()]
    files += views.query_files() if view_files is None else list(view_files)
    for path in files:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _is_current(con, current):
    """Whether the file was built by exactly these files and still has
    every view and macro they made."""
    has = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = '_schema_fingerprint'"
    ).fetchone()[0]
    if not has:
        return False
    row = con.execute("SELECT max(fingerprint), max(objects) FROM _schema_fingerprint").fetchone()
    return row[0] == current and row[1] == con.execute(_OBJECTS).fetchone()[0]


def apply_schema(con):
    """Bring the database to this release's schema, then create the views
    (nothing to do when the file's fingerprint says it has them)."""
    version = recorded_version(con)
    if version is not None and version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"the database was written by a newer stallscope (schema version {version}, "
            f"this release knows up to {SCHEMA_VERSION}): use that release, or a new --db"
        )
    current = fingerprint()
    if version == SCHEMA_VERSION and _is_current(con, current):
        return
    for path in sorted(SCHEMA_DIR.glob("*.sql")):
        con.execute(path.read_text())
    con.execute(_VERSION_TABLE)
    if version is None:
        # A new file already has the newest schema: record it as such.
        con.execute(
            "INSERT INTO schema_version VALUES (?, ?, 'base')", [SCHEMA_VERSION, time.time_ns()]
        )
    else:
        if version == 0 and not con.execute("SELECT count(*) FROM schema_version").fetchone()[0]:
            con.execute("INSERT INTO schema_version VALUES (0, ?, 'base')", [time.time_ns()])
        for number, path in migrations():
            if number <= version:
                continue
            log.info("migrating the database to schema version %d (%s)", number, path.name)
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute(path.read_text())
                con.execute(
                    "INSERT INTO schema_version VALUES (?, ?, ?)",
                    [number, time.time_ns(), path.name],
                )
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
    if views.create_views(con):
        return  # a view file failed: the next open tries again
    con.execute(_FINGERPRINT_TABLE)
    con.execute("DELETE FROM _schema_fingerprint")
    con.execute(
        "INSERT INTO _schema_fingerprint VALUES (?, ?, ?)",
        [current, con.execute(_OBJECTS).fetchone()[0], time.time_ns()],
    )
