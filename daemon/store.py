"""The DuckDB store: one database file, batched columnar appends, views.

Producers (ingest, kernel and GPU probes) hand over whole column batches with
`append()`; a writer thread inserts everything queued, in one transaction,
at least every `flush_interval_s` (default 200 ms), as Arrow tables, never
row by row. Small bookkeeping statements (`sql()`) ride in the same
transaction so that, for instance, a run's `last_seq` is never ahead of the
records stored. A failed write is rolled back, logged, and recorded as a
loss with its reason; the daemon runs on. Listeners see every batch as it is
appended (the gRPC stream subscribes here). The store never blocks a
producer on disk I/O: appends only take a short lock.
"""

import logging
import os
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from . import views

log = logging.getLogger("stallscope.store")

SCHEMA_DIR = Path(__file__).with_name("schema")

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
        os.makedirs(parent, exist_ok=True)
        # DuckDB's buffer pool defaults to 80% of RAM; a tracing daemon on a
        # serving host must stay small (measured in bench/ingest_throughput.py).
        config = {"memory_limit": memory_limit}
        if sandbox:
            config.update(SANDBOX_CONFIG)
        self.con = duckdb.connect(self.path, config=config)
        apply_schema(self.con)
        if sandbox:
            self.con.execute("SET lock_configuration = true")
        self.sandboxed = sandbox
        self.flush_interval_s = flush_interval_s
        self._lock = threading.Lock()
        self._tables = {}       # table -> list of pa.Table waiting
        self.pending_rows = 0   # rows queued and not yet written
        self._statements = []   # (sql, params) waiting, in order
        self._listeners = []
        self._stop = threading.Event()
        self._thread = None
        self._flush_lock = threading.Lock()
        self.rows_written = 0
        self.rows_lost = 0
        self.flushes = 0
        self.last_error = None

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

        If the transaction fails, each table's batch is retried on its own so
        that one bad batch (or a full disk) loses only what cannot be
        written; what is lost is recorded in `losses` with the reason."""
        with self._flush_lock:
            with self._lock:
                tables, self._tables = self._tables, {}
                statements, self._statements = self._statements, []
            if not tables and not statements:
                return 0
            queued = sum(b.num_rows for bs in tables.values() for b in bs)
            merged = {t: (pa.concat_tables(bs, promote_options="default")
                          if len(bs) > 1 else bs[0]) for t, bs in tables.items()}
            cur = self.con.cursor()
            try:
                try:
                    rows = self._write(cur, statements, merged)
                except Exception as exc:
                    self._rollback(cur)
                    log.warning("batch write failed (%s); retrying table by table", exc)
                    rows = self._write_separately(cur, statements, merged)
            finally:
                cur.close()
            with self._lock:
                self.pending_rows -= queued
            self.rows_written += rows
            self.flushes += 1
            return rows

    @staticmethod
    def _rollback(cur):
        try:
            cur.execute("ROLLBACK")
        except Exception:
            pass

    def _write(self, cur, statements, merged):
        cur.execute("BEGIN TRANSACTION")
        for statement, params in statements:
            cur.execute(statement, params or [])
        rows = 0
        for table, data in merged.items():
            self._insert(cur, table, data)
            rows += data.num_rows
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
        rows = 0
        parts = [("statements", statements, None)] + \
                [(table, None, data) for table, data in merged.items()]
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
                lost = data.num_rows if data is not None else len(stmts)
                self._record_loss(cur, name, lost, exc)
        return rows

    def _record_loss(self, cur, table, lost, exc):
        self.rows_lost += lost
        self.last_error = f"{type(exc).__name__}: {exc}"
        log.error("could not write %d rows of %s (%s); recorded as a loss",
                  lost, table, self.last_error)
        now = time.monotonic_ns()
        params = [now, now, lost, f"store_error({table}): {self.last_error}"[:500]]
        sql = ("INSERT INTO losses (run_id, probe, start_ns, end_ns, count, reason) "
               "VALUES (NULL, 'store', ?, ?, ?, ?)")
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
        try:
            self.con.execute("CHECKPOINT")
        except Exception as exc:
            log.warning("checkpoint failed: %s", exc)
        self.con.close()
