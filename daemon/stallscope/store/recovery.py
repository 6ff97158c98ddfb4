"""What the store does while the database cannot be written (disk full, or a
connection DuckDB invalidated after such a failure).

`Recovery` is the part of `store.Store` that keeps a failed flush's rows in
memory (up to `MAX_RETAINED_ROWS`) and retries them, reopens an invalidated
connection, retries a failed batch table by table so that one bad batch loses
only itself, and records every row it must drop in `losses` (probe 'store').
It works on the Store's queues and counters (it is a base class of Store,
not usable alone) and never raises into the writer thread.
"""

import logging
import time

import duckdb
import pyarrow.compute as pc

from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

# Rows kept in memory while the database cannot be written (disk full). About
# 100 bytes a span row: ~50 MB at the bound. Ingest stops reading sockets at
# half the backlog bound (server.INGEST_PAUSE_SHARE of daemon.max_backlog_rows),
# so only kernel and GPU probes push past that; clients count their own drops
# and report them as gaps.
MAX_RETAINED_ROWS = 500_000
MAX_RETAINED_STATEMENTS = 100_000
_REPORT_EVERY_S = 30.0
# The one statement that writes `losses` (Store.record_loss, and the rows this
# module must drop).
LOSS_SQL = (
    "INSERT INTO losses (run_id, probe, start_ns, end_ns, count, reason) VALUES (?, ?, ?, ?, ?, ?)"
)


def transient(exc):
    """A failure that more disk space (or a reopen) can cure: keep the data."""
    text = str(exc)
    return (
        isinstance(exc, (duckdb.IOException, duckdb.FatalException))
        or "No space left" in text
        or "Could not write" in text
        or "invalidated" in text
    )


class Recovery:
    def _open_cursor(self):
        """A cursor for the writer, reopening the database after DuckDB
        invalidated it (a checkpoint that hit a full disk); None if it cannot."""
        if self._reopen:
            try:
                self._drop_writer()
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
        if self._writer is not None:
            return self._writer
        try:
            cur = self.con.cursor()
            cur.register("_batch", self._batch)
        except Exception as exc:
            self._note_fatal(exc)
            self.last_error = f"{type(exc).__name__}: {exc}"
            return None
        self._writer = cur
        return cur

    def _drop_writer(self):
        """Close the writer's cursor; the next flush opens a fresh one."""
        cur, self._writer = self._writer, None
        if cur is not None:
            try:
                cur.close()
            except Exception:
                pass

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
            # a table whose every batch was dropped leaves no empty list behind
            # (the next flush would try to merge nothing: a spurious error)
            self._tables = {t: bs for t, bs in self._tables.items() if bs}
            extra = len(self._statements) - MAX_RETAINED_STATEMENTS
            if extra > 0:
                # Oldest first; mostly superseded `UPDATE runs` bookkeeping.
                del self._statements[:extra]
                dropped_stmts = extra
                losses.append((None, extra, "store_unwritable(statements)"))
            now_ns = time.monotonic_ns()
            for run_id, count, reason in losses:
                reason = f"{reason}: {self.last_error}"[:500]
                self._statements.append(
                    (LOSS_SQL, [run_id, "store", now_ns, now_ns, count, reason])
                )
            kept = total - dropped_rows
            # flush() subtracts every row it took; these are queued again.
            self.pending_rows += put_back - dropped_rows
            if self._oldest is None:
                self._oldest = now_s  # the writer retries in flush_interval_s
            self._note_probe_groups(now_s)  # and the probes' rows with it
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

    def _write_separately(self, cur, statements, merged):
        """Each part in its own transaction; returns the rows written. Parts
        the disk refused are kept for the next flush."""
        rows = 0
        keep_statements, keep_tables = [], {}
        # Rows before statements, as in Store._write.
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
                if transient(exc):
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
        params = [None, "store", now, now, lost, f"store_error({table}): {self.last_error}"[:500]]
        try:
            cur.execute(LOSS_SQL, params)
        except Exception:
            self.sql(LOSS_SQL, params)  # the disk may be full: try again next flush
