"""Runs one user SQL statement for the Query rpc, read-only and bounded.

The database instance itself has no file or network access, loads no
extension and has its configuration locked (see store.SANDBOX_CONFIG); this
module adds what is per query: exactly one statement of a read-only type
(SELECT, EXPLAIN, and what DuckDB parses as SELECT: DESCRIBE, SHOW,
SUMMARIZE, FROM-first, VALUES) whose plan reads no file (DuckDB keeps the
database's own file and WAL readable even without external access, so
`read_blob('<db>')` would hand out the raw file: every table function that
reads files is refused by name in the bound plan), run inside a READ ONLY
transaction (so even
a side-effecting function such as nextval() cannot write), at most
`max_rows` rows, and a time limit enforced by interrupting the cursor from a
timer. Its errors say which kind of failure it was (QueryError: bad SQL;
QueryRefused: the sandbox said no; QueryTimeout: the time limit), so the
API can answer with the matching status code. It never runs anything on the
store's writer connection and never holds the store's locks; its only cost
to ingest is CPU and DuckDB memory.
"""

import json
import re
import threading
import time

import duckdb

from stallscope.errors import NotSandboxed, QueryError, QueryRefused, QueryTimeout

ALLOWED_TYPES = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}

DEFAULT_MAX_ROWS = 100_000
MAX_ROWS_CAP = 10_000_000
DEFAULT_TIMEOUT_S = 10.0
TIMEOUT_CAP_S = 120.0
DEFAULT_BATCH_ROWS = 8192
MAX_BATCH_ROWS = 65_536


# Table functions (as named in a bound plan) that read files or other
# databases. Matched on every plan node, so a subquery cannot hide one.
_FILE_FUNCTION = re.compile(
    r"^(READ_\w+|PARQUET_\w+|GLOB|SNIFF_CSV|\w*_SCAN|ICEBERG_\w+|DELTA_\w+|SQLITE_\w+)$"
)
# Scans of the database's own tables are fine.
_OWN_SCANS = {
    "SEQ_SCAN",
    "TABLE_SCAN",
    "INDEX_SCAN",
    "COLUMN_DATA_SCAN",
    "CHUNK_SCAN",
    "DELIM_SCAN",
    "CTE_SCAN",
    "DUMMY_SCAN",
    "EMPTY_RESULT",
    "EXPRESSION_SCAN",
    "POSITIONAL_SCAN",
    "RECURSIVE_CTE_SCAN",
    "REC_CTE_SCAN",  # DuckDB 2: a recursive CTE reading itself (the peer chain)
    "ARROW_SCAN",
}
_EXPLAIN_PREFIX = re.compile(r"^\s*EXPLAIN\s+", re.IGNORECASE)
_EXPLAIN_ANALYZE = re.compile(r"^\s*EXPLAIN\s+(\(.*\bANALY[SZ]E\b|ANALY[SZ]E\b)", re.I | re.S)


def db_error(exc):
    """The QueryError for a DuckDB error: QueryRefused when the database's
    own confinement refused it (file access, a write in the read-only
    transaction), else QueryError (the statement itself is wrong)."""
    message = str(exc).strip()
    if isinstance(exc, duckdb.PermissionException) or (
        isinstance(exc, duckdb.TransactionException) and "read-only" in message
    ):
        return QueryRefused(message)
    return QueryError(message)


def check_sandbox(cur):
    """Refuse to run anything unless the instance has no external access and
    its configuration is locked (whoever built the Store, and however)."""
    external, locked = cur.execute(
        "SELECT current_setting('enable_external_access'), current_setting('lock_configuration')"
    ).fetchone()
    if external or not locked:
        raise NotSandboxed(
            "the daemon's database is not sandboxed (external access on or configuration "
            "unlocked), so Query is disabled: open it with store.SANDBOX_CONFIG"
        )


def _bounded(value, default, cap):
    if not value or value <= 0:
        return default
    return min(value, cap)


def check_statement(cur, sql):
    """The single read-only statement in `sql`, or QueryError saying why not."""
    try:
        statements = cur.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(str(exc).strip()) from None
    if len(statements) != 1:
        raise QueryError(f"exactly one statement per query, got {len(statements)}")
    stmt = statements[0]
    if stmt.type not in ALLOWED_TYPES:
        kind = str(stmt.type).rsplit(".", 1)[-1]
        raise QueryRefused(
            f"{kind} statements are not allowed: the API is read-only "
            "(SELECT, EXPLAIN, DESCRIBE, SHOW, SUMMARIZE)"
        )
    return stmt


def _plan_functions(node, found):
    """Every operator name and table function name in an EXPLAIN JSON plan."""
    if isinstance(node, list):
        for child in node:
            _plan_functions(child, found)
        return found
    if isinstance(node, dict):
        for key in ("name", "operator_name", "operator_type"):
            if isinstance(node.get(key), str):
                found.add(node[key].strip().upper())
        extra = node.get("extra_info")
        if isinstance(extra, dict) and isinstance(extra.get("Function"), str):
            found.add(extra["Function"].strip().upper())
        _plan_functions(node.get("children", []), found)
    return found


def check_reads_no_file(cur, stmt, params=None):
    """QueryError if the statement's plan reads a file (the database's own
    included). Binds the statement once more; never runs it."""
    text = stmt.query
    if stmt.type == duckdb.StatementType.EXPLAIN:
        if _EXPLAIN_ANALYZE.match(text):
            raise QueryRefused("EXPLAIN ANALYZE runs the statement: use EXPLAIN, or run the SELECT")
        text = _EXPLAIN_PREFIX.sub("", text, count=1)
        if text.lstrip().startswith("("):  # EXPLAIN (FORMAT ...) SELECT
            text = text.lstrip()[text.lstrip().index(")") + 1 :]
    try:
        rows = cur.execute("EXPLAIN (FORMAT json) " + text, params or None).fetchall()
    except duckdb.Error as exc:
        raise db_error(exc) from None
    found = set()
    for row in rows:
        try:
            _plan_functions(json.loads(row[-1]), found)
        except (ValueError, TypeError):
            raise QueryRefused("could not check the statement's plan; refused") from None
    readers = sorted(f for f in found if _FILE_FUNCTION.match(f) and f not in _OWN_SCANS)
    if readers:
        raise QueryRefused(
            f"reading files is not allowed through the API ({', '.join(readers)}): "
            "query the tables and views"
        )


class QueryRun:
    """One query: columns, then Arrow record batches, within its limits.

    Iterate `batches()` after `start()`; `truncated` and `rows` are final
    once the iteration ends. Errors (including the time limit) are
    QueryError."""

    def __init__(self, store, sql, params=None, max_rows=0, timeout_s=0.0, batch_rows=0):
        self.store = store
        self.sql = sql
        self.params = list(params or [])
        self.max_rows = _bounded(max_rows, DEFAULT_MAX_ROWS, MAX_ROWS_CAP)
        self.timeout_s = _bounded(timeout_s, DEFAULT_TIMEOUT_S, TIMEOUT_CAP_S)
        self.batch_rows = _bounded(batch_rows, DEFAULT_BATCH_ROWS, MAX_BATCH_ROWS)
        self.columns = []  # [(name, duckdb type name)]
        self.rows = 0
        self.truncated = False
        self.timed_out = False
        self._cur = None
        self._rel = None
        self._timer = None
        self._t0 = None

    def _interrupt(self):
        self.timed_out = True
        try:
            self._cur.interrupt()
        except Exception:
            pass

    def _error(self, exc):
        if self.timed_out:
            return QueryTimeout(
                f"query exceeded its time limit of {self.timeout_s * 1000:.0f} ms "
                "and was interrupted (ask for fewer rows, or set timeout_ms)"
            )
        if isinstance(exc, duckdb.Error):
            return db_error(exc)
        return QueryError(str(exc).strip())

    def start(self):
        self._t0 = time.monotonic()
        self._cur = self.store.cursor()
        try:
            check_sandbox(self._cur)
            stmt = check_statement(self._cur, self.sql)
            check_reads_no_file(self._cur, stmt, self.params)
        except Exception:
            self.close()
            raise
        self._timer = threading.Timer(self.timeout_s, self._interrupt)
        self._timer.daemon = True
        self._timer.start()
        try:
            self._cur.execute("BEGIN TRANSACTION READ ONLY")
            # A relation streams its result as Arrow batches without the
            # extra copy a DB-API result makes; it runs when first read.
            self._rel = self._cur.sql(self.sql, params=self.params or None)
            if self._rel is not None:
                self.columns = [
                    (name, str(t))
                    for name, t in zip(self._rel.columns, self._rel.types, strict=True)
                ]
        except duckdb.Error as exc:
            self.close()
            raise self._error(exc) from None
        except Exception as exc:  # bad parameters and the like
            self.close()
            raise QueryError(f"{type(exc).__name__}: {exc}") from None
        return self

    def batches(self):
        """Arrow record batches of at most batch_rows rows, max_rows in all."""
        if not self.columns:
            self.close()
            return
        try:
            reader = self._rel.to_arrow_reader(self.batch_rows)
            while self.rows < self.max_rows:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    break
                if batch.num_rows == 0:
                    continue
                room = self.max_rows - self.rows
                if batch.num_rows > room:
                    batch = batch.slice(0, room)
                    self.truncated = True
                self.rows += batch.num_rows
                yield batch
            else:
                # At the limit: is there more? Reading one more batch says.
                try:
                    more = reader.read_next_batch()
                    self.truncated = self.truncated or more.num_rows > 0
                except StopIteration:
                    pass
        except duckdb.Error as exc:
            raise self._error(exc) from None
        except OSError as exc:  # Arrow surfaces an interrupt as an I/O error
            raise self._error(exc) from None
        finally:
            self.close()

    @property
    def elapsed_s(self):
        return time.monotonic() - self._t0 if self._t0 else 0.0

    def close(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._cur is not None:
            try:
                self._cur.execute("ROLLBACK")
            except Exception:
                pass
            try:
                self._cur.close()
            except Exception:
                pass
            self._cur = None
            self._rel = None
