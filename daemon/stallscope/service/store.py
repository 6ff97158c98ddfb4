"""The DuckDB store: one database file, batched columnar appends, views.

Producers (ingest, kernel and GPU probes) hand over whole column batches with
`append()`; a writer thread inserts everything queued, in one transaction,
at least every `flush_interval_s` (default 200 ms), as Arrow tables, never
row by row. Small bookkeeping statements (`sql()`) ride in the same
transaction so that, for instance, a run's `last_seq` is never ahead of the
records stored. A failed write is rolled back, logged, and recorded as a
loss with its reason; the daemon runs on. A write that fails because the
disk is full (or the database was invalidated by such a failure and must be
reopened) is kept in memory, up to `MAX_RETAINED_ROWS`, and retried at every
flush; beyond that bound the oldest rows are dropped and recorded in
`losses` (probe 'store', with their run) when the disk takes writes again.
Listeners see every batch as it is appended (the gRPC stream subscribes
here). The store never blocks a producer on disk I/O: appends only take a
short lock.
"""

import logging
import os
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallscope.analysis import views

log = logging.getLogger("stallscope.store")

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schema"

# The gRPC Query rpc runs users' SQL on cursors of this same database, and
# DuckDB applies these settings per database instance (one process cannot
# open the file twice with different ones): so the whole instance gets no
# file or network access and no extension loading, and its configuration is
# locked once the schema is in place. The daemon's own writes (registered
# Arrow tables + INSERT BY NAME) need none of it; exports use pyarrow.
SANDBOX_CONFIG = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
}

# Rows kept in memory while the database cannot be written (disk full). About
# 100 bytes a span row: ~50 MB at the bound. Ingest stops reading sockets at
# 250k queued rows (server.MAX_PENDING_ROWS), so only kernel and GPU probes
# push past that; clients count their own drops and report them as gaps.
MAX_RETAINED_ROWS = 500_000
MAX_RETAINED_STATEMENTS = 100_000
_REPORT_EVERY_S = 30.0


def _transient(exc):
    """A failure that more disk space (or a reopen) can cure: keep the data."""
    text = str(exc)
    return (
        isinstance(exc, (duckdb.IOException, duckdb.FatalException))
        or "No space left" in text
        or "Could not write" in text
        or "invalidated" in text
    )


def _as_arrow(columns):
    """Columns (name -> numpy array, pyarrow array or list) as a pa.Table."""
    arrays, names = [], []
    for name, col in columns.items():
        if isinstance(col, (pa.Array, pa.ChunkedArray)):
            arrays.append(col)
        elif isinstance(col, np.ndarray) and col.dtype != object:
            arrays.append(pa.array(col))
        else:
            arrays.append(pa.array(list(col) if not isinstance(col, list) else col))
        names.append(name)
    return pa.Table.from_arrays(arrays, names=names)


def apply_schema(con):
    """Create every table (idempotent) and then the query views."""
    for path in sorted(SCHEMA_DIR.glob("*.sql")):
        con.execute(path.read_text())
    views.create_views(con)


class Store:
    """The daemon's one writable connection to the database file."""

    def __init__(self, path, flush_interval_s=0.2, memory_limit="128MB", sandbox=True):
        self.path = str(path)
        parent = os.path.dirname(os.path.abspath(self.path))
        # The database holds every traced process's argv: a directory the
        # daemon creates is not readable by others (an existing one is the
        # administrator's choice).
        os.makedirs(parent, mode=0o750, exist_ok=True)
        # DuckDB's buffer pool defaults to 80% of RAM; a tracing daemon on a
        # serving host must stay small (measured in bench/ingest_throughput.py).
        self._config = {"memory_limit": memory_limit}
        if sandbox:
            self._config.update(SANDBOX_CONFIG)
        self.con = duckdb.connect(self.path, config=self._config)
        apply_schema(self.con)
        if sandbox:
            self.con.execute("SET lock_configuration = true")
        self.sandboxed = sandbox
        self.flush_interval_s = flush_interval_s
        self._lock = threading.Lock()
        self._tables = {}  # table -> list of pa.Table waiting
        self.pending_rows = 0  # rows queued and not yet written
        self._statements = []  # (sql, params) waiting, in order
        self._listeners = []
        self._stop = threading.Event()
        self._thread = None
        self._flush_lock = threading.Lock()
        self.rows_written = 0
        self.rows_lost = 0
        self.flushes = 0
        self.last_error = None
        self.rows_retained = 0  # rows kept in memory after a failed write
        self.unwritable_since = None  # monotonic seconds of the first failure
        self._reported_at = 0.0
        self._reopen = False  # the connection was invalidated: reopen it
        self._kept = None

    # ----- producers ---------------------------------------------------------
    def append(self, table, columns):
        """Queue a batch of rows for `table`: a pa.Table or name -> column."""
        batch = columns if isinstance(columns, pa.Table) else _as_arrow(columns)
        if batch.num_rows == 0:
            return
        with self._lock:
            self._tables.setdefault(table, []).append(batch)
            self.pending_rows += batch.num_rows
        for listener in self._listeners:
            try:
                listener(table, batch)
            except Exception:
                log.exception("store listener failed")

    def sql(self, statement, params=None):
        """Queue a bookkeeping statement for the next flush's transaction."""
        with self._lock:
            self._statements.append((statement, params))

    def add_listener(self, fn):
        """fn(table, pa.Table) is called for every appended batch."""
        self._listeners.append(fn)

    def remove_listener(self, fn):
        try:
            self._listeners.remove(fn)
        except ValueError:
            pass

    # ----- readers -------------------------------------------------------------
    def cursor(self):
        """A cursor on the same database for reads from another thread."""
        return self.con.cursor()

    def exclusive(self):
        """A lock that holds the writer off (retention's deletes and CHECKPOINT)."""
        return self._flush_lock

    # ----- writer ------------------------------------------------------------
    def start(self):
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self.flush_interval_s):
            self.flush()

    def flush(self):
        """Write everything queued so far, in one transaction if possible.

        If the transaction fails because the disk is full, everything is kept
        for the next flush (bounded, see `_retain`). If it fails otherwise,
        each table's batch is retried on its own so that one bad batch loses
        only what cannot be written; what is lost is recorded in `losses`."""
        with self._flush_lock:
            with self._lock:
                tables, self._tables = self._tables, {}
                statements, self._statements = self._statements, []
            if not tables and not statements:
                return 0
            queued = sum(b.num_rows for bs in tables.values() for b in bs)
            merged = {
                t: (pa.concat_tables(bs, promote_options="default") if len(bs) > 1 else bs[0])
                for t, bs in tables.items()
            }
            self._kept = None  # set by _retain when this flush keeps rows back
            cur = self._open_cursor()
            if cur is None:
                self._retain(statements, merged, self.last_error)
                rows = 0
            else:
                try:
                    try:
                        rows = self._write(cur, statements, merged)
                    except Exception as exc:
                        self._rollback(cur)
                        if _transient(exc):
                            self._note_fatal(exc)
                            self._retain(statements, merged, exc)
                            rows = 0
                        else:
                            log.warning("batch write failed (%s); retrying table by table", exc)
                            rows = self._write_separately(cur, statements, merged)
                finally:
                    cur.close()
            with self._lock:
                self.pending_rows -= queued
            self.rows_written += rows
            self.flushes += 1
            if self._kept is None and self.unwritable_since is not None:
                log.warning(
                    "database writable again after %.1f s; rows kept meanwhile "
                    "are written, %d dropped in all (see losses, probe 'store')",
                    time.monotonic() - self.unwritable_since,
                    self.rows_lost,
                )
                self.unwritable_since = None
            self.rows_retained = self._kept or 0
            return rows

    def _open_cursor(self):
        """A cursor for the writer, reopening the database after DuckDB
        invalidated it (a checkpoint that hit a full disk); None if it cannot."""
        if self._reopen:
            try:
                try:
                    self.con.close()
                except Exception:
                    pass
                self.con = duckdb.connect(self.path, config=self._config)
                if self.sandboxed:
                    self.con.execute("SET lock_configuration = true")
                self._reopen = False
                log.warning("reopened the database %s after a write failure", self.path)
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                return None
        try:
            return self.con.cursor()
        except Exception as exc:
            self._note_fatal(exc)
            self.last_error = f"{type(exc).__name__}: {exc}"
            return None

    def _note_fatal(self, exc):
        if (
            isinstance(exc, duckdb.FatalException)
            or "invalidated" in str(exc)
            or "closed" in str(exc)
        ):
            self._reopen = True

    def _retain(self, statements, merged, exc):
        """Put a failed flush back at the head of the queue; drop (and record)
        the oldest rows beyond MAX_RETAINED_ROWS."""
        now_s = time.monotonic()
        self.last_error = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        dropped_rows = dropped_stmts = 0
        put_back = sum(data.num_rows for data in merged.values())
        with self._lock:
            for table, data in merged.items():
                self._tables[table] = [data] + self._tables.get(table, [])
            self._statements = list(statements) + self._statements
            total = sum(b.num_rows for bs in self._tables.values() for b in bs)
            excess = total - MAX_RETAINED_ROWS
            losses = []
            for table, batches in self._tables.items():
                while excess > 0 and batches:
                    head = batches[0]
                    k = min(excess, head.num_rows)
                    losses += self._loss_rows(table, head.slice(0, k))
                    batches[0] = head.slice(k)
                    if batches[0].num_rows == 0:
                        batches.pop(0)
                    excess -= k
                    dropped_rows += k
            extra = len(self._statements) - MAX_RETAINED_STATEMENTS
            if extra > 0:
                # Oldest first; mostly superseded `UPDATE runs` bookkeeping.
                del self._statements[:extra]
                dropped_stmts = extra
                losses.append((None, extra, "store_unwritable(statements)"))
            now_ns = time.monotonic_ns()
            for run_id, count, reason in losses:
                self._statements.append(
                    (
                        "INSERT INTO losses (run_id, probe, start_ns, end_ns, count, reason) "
                        "VALUES (?, 'store', ?, ?, ?, ?)",
                        [run_id, now_ns, now_ns, count, f"{reason}: {self.last_error}"[:500]],
                    )
                )
            kept = total - dropped_rows
            # flush() subtracts every row it took; these are queued again.
            self.pending_rows += put_back - dropped_rows
        self._kept = kept
        self.rows_lost += dropped_rows + dropped_stmts
        if self.unwritable_since is None:
            self.unwritable_since = now_s
            self._reported_at = now_s
            log.error(
                "cannot write the database %s (%s): keeping up to %d rows in memory "
                "and retrying every %.1f s; probes and clients keep running",
                self.path,
                self.last_error,
                MAX_RETAINED_ROWS,
                self.flush_interval_s,
            )
        elif now_s - self._reported_at >= _REPORT_EVERY_S or (
            dropped_rows and not self.rows_lost - dropped_rows
        ):
            self._reported_at = now_s
            log.error(
                "database still unwritable for %.0f s (%s): %d rows kept, %d dropped "
                "so far (recorded as losses when the disk takes writes again)",
                now_s - self.unwritable_since,
                self.last_error,
                kept,
                self.rows_lost,
            )

    @staticmethod
    def _loss_rows(table, dropped):
        """(run_id, count, reason) for rows dropped from a table's batch."""
        reason = f"store_unwritable({table})"
        if "run_id" not in dropped.column_names:
            return [(None, dropped.num_rows, reason)]
        counts = pc.value_counts(dropped.column("run_id")).to_pylist()
        return [(c["values"], c["counts"], reason) for c in counts]

    @staticmethod
    def _rollback(cur):
        try:
            cur.execute("ROLLBACK")
        except Exception:
            pass

    def _write(self, cur, statements, merged):
        # Rows first, then statements: an UPDATE of a row appended in the
        # same flush (a run ingest started since the last one) finds it.
        cur.execute("BEGIN TRANSACTION")
        rows = 0
        for table, data in merged.items():
            self._insert(cur, table, data)
            rows += data.num_rows
        for statement, params in statements:
            cur.execute(statement, params or [])
        cur.execute("COMMIT")
        return rows

    @staticmethod
    def _insert(cur, table, data):
        cur.register("_batch", data)
        try:
            cur.execute(f'INSERT INTO "{table}" BY NAME SELECT * FROM _batch')
        finally:
            cur.unregister("_batch")

    def _write_separately(self, cur, statements, merged):
        """Each part in its own transaction; returns the rows written. Parts
        the disk refused are kept for the next flush."""
        rows = 0
        keep_statements, keep_tables = [], {}
        parts = [(table, None, data) for table, data in merged.items()]
        parts.append(("statements", statements, None))
        for name, stmts, data in parts:
            try:
                cur.execute("BEGIN TRANSACTION")
                if stmts is not None:
                    for statement, params in stmts:
                        cur.execute(statement, params or [])
                else:
                    self._insert(cur, name, data)
                cur.execute("COMMIT")
                rows += data.num_rows if data is not None else 0
            except Exception as exc:
                self._rollback(cur)
                if _transient(exc):
                    self._note_fatal(exc)
                    if stmts is not None:
                        keep_statements = stmts
                    else:
                        keep_tables[name] = data
                    continue
                if stmts is not None:
                    rows_ok, bad = self._statements_one_by_one(cur, stmts)
                    if bad:
                        self._record_loss(cur, name, bad, exc)
                    continue
                lost = data.num_rows
                self._record_loss(cur, name, lost, exc)
        if keep_statements or keep_tables:
            self._retain(keep_statements, keep_tables, self.last_error or "write failed")
        return rows

    def _statements_one_by_one(self, cur, stmts):
        """One bad bookkeeping statement must not take the others with it."""
        ok = bad = 0
        for statement, params in stmts:
            try:
                cur.execute(statement, params or [])
                ok += 1
            except Exception as exc:
                bad += 1
                log.error("bookkeeping statement failed (%s): %s", exc, statement[:80])
        return ok, bad

    def _record_loss(self, cur, table, lost, exc):
        self.rows_lost += lost
        self.last_error = f"{type(exc).__name__}: {exc}"
        log.error(
            "could not write %d rows of %s (%s); recorded as a loss", lost, table, self.last_error
        )
        now = time.monotonic_ns()
        params = [now, now, lost, f"store_error({table}): {self.last_error}"[:500]]
        sql = (
            "INSERT INTO losses (run_id, probe, start_ns, end_ns, count, reason) "
            "VALUES (NULL, 'store', ?, ?, ?, ?)"
        )
        try:
            cur.execute(sql, params)
        except Exception:
            self.sql(sql, params)  # the disk may be full: try again next flush

    def close(self):
        """Stop the writer, write what is left, close the file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()
        if self.rows_retained:
            log.error(
                "exiting with %d rows the database would not take (%s): they are lost",
                self.rows_retained,
                self.last_error,
            )
        try:
            self.con.execute("CHECKPOINT")
        except Exception as exc:
            log.warning("checkpoint failed: %s", exc)
        self.con.close()
