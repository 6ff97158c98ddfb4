"""The DuckDB store: one database file, batched columnar appends, views.

Producers (ingest, kernel and GPU probes) hand over whole column batches with
`append()`; a writer thread inserts what is queued, in one transaction, as
Arrow tables, never row by row, and sleeps while nothing is queued: each
INSERT costs 1-3 ms of CPU whatever its size, so the cost follows the
batches, not the rows. The clients' tables (spans, GC passes, runs and the
bookkeeping) are written as soon as the main loop has decoded them
(`decoded()`, every 0.7 s: a SIGKILL loses at most ~0.75 s of a run), or
when their oldest queued batch is `flush_interval_s` old (0.5 s: rows
decoded for the live stream, bookkeeping queued between decodes);
the probes' own tables (`PROBE_TABLES`: off-CPU, run-queue, kernel causes,
GPU samples, the daemon's own stats) when theirs is `probe_flush_interval_s`
old (4 s), which writes each of them an eighth as often (each INSERT's
fixed cost was 0.3-0.4 % of a core at 2 s for a 200 steps/s engine); everything when
`flush_rows` rows are queued.
A reader that asks for a cursor (`cursor()`: the gRPC Query, status) first
gets everything appended so far written. Small bookkeeping statements
(`sql()`, and what flush hooks return) ride in the same transaction so that,
for instance, a run's `last_seq` is never ahead of the records stored. A
failed write is rolled back, logged, and recorded as a loss with its reason;
the daemon runs on. A write that fails because the disk is full (or the
database was invalidated by such a failure and must be reopened) is kept in
memory and retried (`store_recovery.py`). Writes to `losses` and
`probe_status` go through `record_loss` / `record_losses` /
`record_probe_status` only, so each table has one writer. Listeners see every
batch as it is appended (the gRPC stream subscribes here). The store never
blocks a producer on disk I/O: appends only take a short lock.
"""

import logging
import os
import threading
import time

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallscope import threads
from stallscope.store.migrations import apply_schema, stored_tables
from stallscope.store.recovery import LOSS_SQL, Recovery, transient
from stallscope.vocab.log_channels import log_channel
from stallscope.vocab.schema import STORED_NS_VARIABLE

log = logging.getLogger(log_channel(__name__))

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

# Tables that carry stored_ns (read from the schema files); `stallscope
# export parquet` sends these.
STORED_TABLES = stored_tables()

# The one statement that writes `probe_status` (record_probe_status).
_STATUS_SQL = (
    "INSERT INTO probe_status (ts_ns, probe, backend, state, detail) VALUES (?, ?, ?, ?, ?)"
)


class _HeldBatch:
    """The rows the writer's next INSERT reads, as an Arrow stream: DuckDB
    scans the object registered as `_batch` afresh at each statement, so one
    registration serves every table of every flush."""

    __slots__ = ("table",)

    def __init__(self):
        self.table = None

    # what DuckDB reads at registration, when no INSERT is under way
    EMPTY = pa.table({"_": pa.array([], pa.int8())})

    def __arrow_c_stream__(self, requested_schema=None):
        table = self.EMPTY if self.table is None else self.table
        return table.__arrow_c_stream__(requested_schema)


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


def _concat(batches):
    """One table from a flush's batches of one table. Batches from different
    producers may type a column differently (int8 vs int64, a dictionary vs
    plain strings): they are promoted to a common type, and the INSERT casts
    to the column's own type."""
    if len(batches) == 1:
        return batches[0]
    try:
        return pa.concat_tables(batches, promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        plain = [_undictionary(b) for b in batches]
        return pa.concat_tables(plain, promote_options="permissive")


def _undictionary(table):
    for i, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(field.type.value_type))
    return table


# Traces hold every traced process's argv and timings: the database and its
# WAL are for the daemon and its group only (the unit runs the daemon as
# group `stallscope`, so that is the group readers join). DuckDB creates both
# with the process umask (the WAL anew after every checkpoint), so the daemon
# runs with DB_UMASK (service.server) and the main file is also fixed here.
# No chown: under the unit the group is already right, and its system-call
# filter has no @chown.
DB_UMASK = 0o027
DB_MODE = 0o640


# The probes' own tables, written every probe_flush_interval_s rather than
# every flush_interval_s (their rows have no client waiting to see them
# stored; a reader's cursor() still writes them first).
PROBE_TABLES = frozenset(
    {
        "offcpu",
        "runq",
        "migrations",
        "sched_summary",
        "syscalls",
        "cuda_calls",
        "page_faults",
        "irq_time",
        "steal",
        "placement",
        "placement_cpu",
        "nvml_samples",
        "nvml_clock_sync",
        "daemon_stats",
        # the CPU sampler's rows, written together (a stack before its samples)
        "cpu_samples",
        "cpu_stacks",
        "cpu_frames",
    }
)
# The probe tables flushed together: the CPU sampler's three (a stack before
# its samples); every other probe table on its own.
_PROBE_GROUP = {t: ("cpu" if t.startswith("cpu_") else t) for t in PROBE_TABLES}
# A probe table (group) with fewer rows queued than this waits up to
# SMALL_PROBE_WAIT_S instead of probe_flush_interval_s: an INSERT costs
# ~1 ms of CPU here for 1 row as for 1,000, and at 200 steps/s seven of the
# probes' tables (migrations, steal, IRQ, placement, the daemon's stats,
# the CPU sampler's stacks) carry a few rows every 4 s.
SMALL_PROBE_ROWS = 64
SMALL_PROBE_WAIT_S = 16.0
# The probes' loss rows (`losses`, probe != 'client': the CPU sampler reports
# native-only samples of torch's OpenMP workers once a second) ride with the
# next flush of any kind instead of starting one 0.5 s later: on the
# transformers engine they made 90 extra transactions in 2 minutes (a third
# of all). Queued under this group, they are written at the latest when a
# small probe table would be (SMALL_PROBE_WAIT_S).
RIDER_GROUP = "riders"
# A decode's flush takes along the probe groups due before the next decode,
# expected as far off as the last two were apart, but no further than this.
MAX_DECODE_GAP_S = 1.0
# Tables never dropped at the bound: they are the record of what was lost.
_NEVER_DROPPED = frozenset({"losses", "probe_status", "ingest_errors"})
DEFAULT_MAX_BACKLOG_ROWS = 500_000


def _time_range(batch):
    """(first, last) time of a batch's rows, from its first time column."""
    for name in ("start_ns", "ts_ns"):
        if name in batch.column_names:
            col = batch[name]
            lo, hi = pc.min(col).as_py(), pc.max(col).as_py()
            if lo is not None:
                return int(lo), int(hi)
    now = time.monotonic_ns()
    return now, now


def _from_background_thread(fn):
    """fn() on a short-lived background thread (what it starts inherits its
    SCHED_IDLE), waited for."""
    errors = []

    def run():
        threads.background("store-setup")
        try:
            fn()
        except Exception as exc:
            errors.append(exc)

    t = threading.Thread(target=run, name="store-setup")
    t.start()
    t.join()
    if errors:
        raise errors[0]


def _restrict(path):
    """Mode 0640 for a database file the daemon opens."""
    try:
        os.chmod(path, DB_MODE)
    except OSError as exc:
        log.warning("cannot set mode %o on %s: %s", DB_MODE, path, exc)


class Store(Recovery):
    """The daemon's one writable connection to the database file."""

    def __init__(
        self,
        path,
        flush_interval_s=0.5,
        memory_limit="128MB",
        sandbox=True,
        flush_rows=50_000,
        max_backlog_rows=DEFAULT_MAX_BACKLOG_ROWS,
        duckdb_threads=1,
        probe_flush_interval_s=4.0,
    ):
        self.path = str(path)
        parent = os.path.dirname(os.path.abspath(self.path))
        # The database holds every traced process's argv: a directory the
        # daemon creates is not readable by others (an existing one is the
        # administrator's choice).
        os.makedirs(parent, mode=0o750, exist_ok=True)
        # DuckDB's buffer pool defaults to 80% of RAM; a tracing daemon on a
        # serving host must stay small (measured in bench/ingest_throughput.py).
        # threads = 1 and no async I/O threads: DuckDB starts no thread of its
        # own (it would start 8 I/O threads by default), so every query runs
        # on the thread that asks (background ones: the writer, the step
        # fill, retention, the API's query pool). More workers are started
        # by a background thread, whose SCHED_IDLE they inherit.
        self._config = {"memory_limit": memory_limit, "threads": 1, "async_threads": 0}
        if sandbox:
            self._config.update(SANDBOX_CONFIG)
        self.con = duckdb.connect(self.path, config=self._config)
        _restrict(self.path)
        apply_schema(self.con)
        self.duckdb_threads = max(1, int(duckdb_threads))
        if self.duckdb_threads > 1:
            _from_background_thread(
                lambda: self.con.execute(f"SET threads = {self.duckdb_threads}")
            )
        if sandbox:
            self.con.execute("SET lock_configuration = true")
        self.sandboxed = sandbox
        self.flush_interval_s = flush_interval_s
        self.probe_flush_interval_s = max(flush_interval_s, probe_flush_interval_s)
        self.flush_rows = flush_rows
        # The probes' rows queued beyond this are dropped, each batch counted
        # as a loss ('daemon_backlog'): the writer runs at idle priority and a
        # host whose CPUs are all busy can starve it; memory stays bounded and
        # nothing is lost unreported. Clients' rows are held back by ingest
        # instead (it stops reading their sockets while the writer, raised to
        # normal priority, catches up), and dropped the same way only when
        # the writer cannot be raised (then ingest reads on).
        self.max_backlog_rows = int(max_backlog_rows)
        self.rows_dropped = 0
        self._dropped = {}  # (table, run_id) -> [rows, first, last time] not yet recorded
        self._lock = threading.Lock()
        self._tables = {}  # table -> list of pa.Table waiting
        self.pending_rows = 0  # rows queued and not yet written
        self._statements = []  # (sql, params) waiting, in order
        self._oldest = None  # monotonic seconds of the oldest queued write (clients' tables)
        self._decoded = False  # the main loop decoded: write the clients' rows now (decoded())
        self._last_decoded = None  # monotonic seconds of the last decoded() call
        self._decode_gap_s = 0.0  # between the last two (at most MAX_DECODE_GAP_S)
        # ... of PROBE_TABLES: per group (_PROBE_GROUP), its oldest queued batch
        self._probe_since = {}
        self._due = threading.Condition(self._lock)  # the writer sleeps on it
        self._hooks = []  # fn() -> [(sql, params)] at the start of each flush
        self._listeners = []
        self._stop = threading.Event()
        self._thread = None
        # Re-entrant: a thread holding exclusive() (retention) may open a
        # cursor, which flushes first.
        self._flush_lock = threading.RLock()
        self.rows_written = 0
        self.rows_lost = 0
        self.flushes = 0
        self.last_error = None
        self.rows_retained = 0  # rows kept in memory after a failed write
        self.unwritable_since = None  # monotonic seconds of the first failure
        self._reported_at = 0.0
        self._reopen = False  # the connection was invalidated: reopen it
        # The writer's own cursor, kept between flushes with `_batch`
        # registered on it (registering an Arrow table per INSERT cost
        # ~0.55 ms of CPU on this VM, as much as a small INSERT itself).
        self._writer = None
        self._batch = _HeldBatch()
        self._kept = None
        self._last_stored_ns = self._max_stored_ns()

    def _max_stored_ns(self):
        """The largest stored_ns in the file (its min/max statistics answer)."""
        parts = " UNION ALL ".join(f"SELECT max(stored_ns) AS v FROM {t}" for t in STORED_TABLES)
        # fetchall, not fetchone: a result left unread keeps its transaction
        # open, and an open transaction stops a checkpoint from freeing space.
        return self.con.execute(f"SELECT coalesce(max(v), 0) FROM ({parts})").fetchall()[0][0]

    def _next_stored_ns(self):
        """This flush's stored_ns: CLOCK_REALTIME, but strictly above every
        earlier flush's, even after a restart or a step back of the clock."""
        self._last_stored_ns = max(time.time_ns(), self._last_stored_ns + 1)
        return self._last_stored_ns

    # ----- producers ---------------------------------------------------------
    def append(self, table, columns, ride=False):
        """Queue a batch of rows for `table`: a pa.Table or name -> column.
        `ride`: rows of a clients' table that need no flush of their own;
        they go with the next one (RIDER_GROUP)."""
        batch = columns if isinstance(columns, pa.Table) else _as_arrow(columns)
        if batch.num_rows == 0:
            return
        with self._lock:
            if self.pending_rows + batch.num_rows > self.max_backlog_rows and (
                table in PROBE_TABLES or (table not in _NEVER_DROPPED and threads.boost_refused())
            ):
                self._drop(table, batch)
                return
            self._tables.setdefault(table, []).append(batch)
            self.pending_rows += batch.num_rows
            group = _PROBE_GROUP.get(table)
            self._queued(RIDER_GROUP if ride and group is None else group)
        for listener in self._listeners:
            try:
                listener(table, batch)
            except Exception:
                log.exception("store listener failed")

    def _drop(self, table, batch):
        """Count a batch past the backlog bound (lock held); its loss rows are
        written with the next flush, per run where the rows name one (so a
        run's stored and lost records still add up to what its client made)."""
        if "run_id" in batch.column_names:
            parts = [
                (run_id, batch.filter(pc.equal(batch["run_id"], run_id)))
                for run_id in pc.unique(batch["run_id"]).to_pylist()
                if run_id is not None
            ]
        else:
            parts = [(None, batch)]
        for run_id, part in parts:
            lo, hi = _time_range(part)
            entry = self._dropped.setdefault((table, run_id), [0, lo, hi])
            entry[0] += part.num_rows
            entry[1] = min(entry[1], lo)
            entry[2] = max(entry[2], hi)
        self.rows_dropped += batch.num_rows
        self._queued()

    def backlog(self):
        """The fraction of the backlog bound in use (the writer's gauge)."""
        return self.pending_rows / max(1, self.max_backlog_rows)

    def sql(self, statement, params=None):
        """Queue a bookkeeping statement for the next flush's transaction."""
        with self._lock:
            self._statements.append((statement, params))
            self._queued()

    def decoded(self):
        """The main loop has decoded what it read: write the clients' rows now
        rather than when the oldest is flush_interval_s old. One flush per
        decode (service.server.DECODE_INTERVAL_S apart) instead of a decode
        every 0.25 s and a flush 0.5 s after the first: fewer of both, and a
        record waits at most one decode interval and one flush."""
        now = time.monotonic()
        with self._lock:
            if self._last_decoded is not None:
                self._decode_gap_s = min(now - self._last_decoded, MAX_DECODE_GAP_S)
            self._last_decoded = now
            if self._oldest is not None and not self._decoded:
                self._decoded = True
                self._due.notify()

    def _queued(self, probe_group=None):
        """Called with the lock held after anything was queued (`probe_group`:
        rows of a probe table of that group)."""
        if probe_group is not None:
            if not self._probe_since:
                self._due.notify()
            self._probe_since.setdefault(probe_group, time.monotonic())
        elif self._oldest is None:
            self._oldest = time.monotonic()
            self._due.notify()
        if self.pending_rows >= self.flush_rows:
            self._due.notify()

    def _note_probe_groups(self, now):
        """Every queued probe table's group has a since time (rows put back)."""
        for table in self._tables:
            if table in PROBE_TABLES:
                self._probe_since.setdefault(_PROBE_GROUP[table], now)

    def _probe_at(self):
        """{probe table group: when it is due}; the lock held."""
        rows = {}
        for t, bs in self._tables.items():
            g = _PROBE_GROUP.get(t)
            if g is not None:
                rows[g] = rows.get(g, 0) + sum(b.num_rows for b in bs)
        small_wait = max(SMALL_PROBE_WAIT_S, self.probe_flush_interval_s)
        return {
            g: since
            + (self.probe_flush_interval_s if rows.get(g, 0) >= SMALL_PROBE_ROWS else small_wait)
            for g, since in self._probe_since.items()
        }

    def _probe_due(self, now):
        """(the probe table groups due now, when the next one is due or
        None, {group: when it is due}); the lock held."""
        at = self._probe_at()
        next_at = min(at.values(), default=None)
        if next_at is None or next_at > now:
            return set(), next_at, at
        # Once one group is due, the groups due within half an interval go
        # with it (a reader appends offcpu and runq microseconds apart: one
        # transaction, not two).
        soon = now + self.probe_flush_interval_s / 2
        return {g for g, t in at.items() if t <= soon}, next_at, at

    def add_flush_hook(self, fn):
        """fn() -> [(sql, params)] runs at the start of every flush (before the
        queued rows are taken, so its statements never run ahead of them);
        what it returns rides in that flush's transaction, after the rows.
        For bookkeeping that only needs its latest state written."""
        self._hooks.append(fn)

    def record_loss(self, probe, start_ns, end_ns, count, reason, run_id=None):
        """A known gap: `count` records of `probe` lost in [start_ns, end_ns)."""
        self.sql(LOSS_SQL, [run_id, probe, int(start_ns), int(end_ns), int(count), str(reason)])

    def record_losses(self, probe, losses, ride=False):
        """Many gaps at once: `losses` = [(run_id, start_ns, end_ns, count, reason)].
        `ride`: written with the next flush, not one of their own (a probe's)."""
        if losses:
            run_id, start_ns, end_ns, count, reason = (list(c) for c in zip(*losses, strict=True))
            columns = {"run_id": run_id, "probe": [probe] * len(run_id), "start_ns": start_ns}
            self.append(
                "losses",
                {**columns, "end_ns": end_ns, "count": count, "reason": reason},
                ride=ride,
            )

    def record_probe_status(self, probe, backend, state, detail):
        """A probe's state now ('active', 'unavailable', 'failed', ...) and why."""
        self.sql(_STATUS_SQL, [time.monotonic_ns(), probe, backend, state, detail])

    def add_listener(self, fn):
        """fn(table, pa.Table) is called for every appended batch."""
        self._listeners.append(fn)

    def remove_listener(self, fn):
        try:
            self._listeners.remove(fn)
        except ValueError:
            pass

    # ----- readers -------------------------------------------------------------
    def cursor(self, fresh=True):
        """A cursor on the same database for reads from another thread; with
        `fresh`, what was appended before the call is written first (read your
        writes). Callers holding a lock a flush hook takes pass fresh=False."""
        if fresh and (self._oldest is not None or self._probe_since or self._hooks):
            self.flush()
        return self.con.cursor()

    def exclusive(self):
        """A lock that holds the writer off (retention's deletes and CHECKPOINT)."""
        return self._flush_lock

    # ----- writer ------------------------------------------------------------
    def start(self):
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    def _run(self):
        threads.background("store", backlog=self.backlog)
        while not self._stop.is_set():
            with self._lock:
                # Asleep while nothing is queued; then until the oldest write
                # of either kind is due or flush_rows rows wait.
                while not self._stop.is_set():
                    now = time.monotonic()
                    probe_groups, probe_at, group_at = self._probe_due(now)
                    dues = [
                        at - now
                        for at in (
                            None if self._oldest is None else self._oldest + self.flush_interval_s,
                            probe_at,
                        )
                        if at is not None
                    ]
                    wait = min(dues) if dues else None
                    if (
                        self._decoded
                        or self.pending_rows >= self.flush_rows
                        or (wait is not None and wait <= 0)
                    ):
                        break
                    self._due.wait(wait)
                # all the probes' tables once flush_rows rows wait, else the groups due
                probe_due = self.pending_rows >= self.flush_rows or probe_groups
                if self._decoded and probe_due is not True:
                    # A decode's flush also takes the probe groups due before
                    # the next one's: one transaction, not two (its BEGIN,
                    # SET VARIABLE and COMMIT cost 2-3 ms).
                    until = now + self._decode_gap_s
                    probe_due = set(probe_due) | {g for g, at in group_at.items() if at <= until}
            if self._stop.is_set():
                return
            threads.dodge_step_threads()  # a flush is a burst of 2-5 ms of CPU
            try:
                self.flush(probe_tables=probe_due)
            except Exception:  # a bug here must not end all writing: say it, go on
                log.exception("store flush failed; the writer goes on")
                self._stop.wait(self.flush_interval_s)

    def flush(self, probe_tables=True):
        """Write everything queued so far (with `probe_tables` false: all but
        the probes' tables; a set: only the probe table groups it names), in
        one transaction if possible.

        If the transaction fails because the disk is full, everything is kept
        for the next flush (bounded, see `_retain`). If it fails otherwise,
        each table's batch is retried on its own so that one bad batch loses
        only what cannot be written; what is lost is recorded in `losses`."""
        with self._flush_lock:
            hooked = []
            for hook in self._hooks:
                try:
                    hooked += hook()
                except Exception:
                    log.exception("store flush hook failed")
            with self._lock:
                if probe_tables is True or not self._probe_since:
                    tables, self._tables = self._tables, {}
                    self._probe_since = {}
                else:
                    groups = probe_tables or ()

                    def taken(t):
                        return t not in PROBE_TABLES or _PROBE_GROUP[t] in groups

                    tables = {t: b for t, b in self._tables.items() if taken(t)}
                    self._tables = {t: b for t, b in self._tables.items() if not taken(t)}
                    for g in (*groups, RIDER_GROUP):  # riders: the clients' tables, all taken
                        self._probe_since.pop(g, None)
                statements, self._statements = self._statements + hooked, []
                self._oldest = None
                self._decoded = False
                dropped, self._dropped = self._dropped, {}
            for (table, run_id), (rows, lo, hi) in dropped.items():
                statements.append((LOSS_SQL, [run_id, table, lo, hi, rows, "daemon_backlog"]))
                log.warning(
                    "dropped %d %s rows past the backlog bound (daemon.max_backlog_rows = %d): "
                    "the writer could not keep up (recorded in losses, reason daemon_backlog)",
                    rows,
                    table,
                    self.max_backlog_rows,
                )
            if not tables and not statements:
                return 0
            queued = sum(b.num_rows for bs in tables.values() for b in bs)
            merged = {}
            for t, bs in tables.items():
                try:
                    merged[t] = _concat(bs)
                except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
                    # Producers disagree on a column's type beyond what a
                    # cast unifies: those rows are lost, the rest is written.
                    n = sum(b.num_rows for b in bs)
                    log.error("%d rows for %s could not be merged: %s", n, t, exc)
                    now = time.monotonic_ns()
                    reason = f"store_merge_failed({t}): {exc}"[:500]
                    statements.append((LOSS_SQL, [None, "store", now, now, n, reason]))
            self._kept = None  # set by _retain when this flush keeps rows back
            cur = self._open_cursor()
            if cur is None:
                self._retain(statements, merged, self.last_error)
                rows = 0
            else:
                try:
                    cur.execute(f"SET VARIABLE {STORED_NS_VARIABLE} = ?", [self._next_stored_ns()])
                    rows = self._write(cur, statements, merged)
                except Exception as exc:
                    self._rollback(cur)
                    try:
                        if transient(exc):
                            self._note_fatal(exc)
                            self._retain(statements, merged, exc)
                            rows = 0
                        else:
                            log.warning("batch write failed (%s); retrying table by table", exc)
                            rows = self._write_separately(cur, statements, merged)
                    finally:
                        self._drop_writer()  # the next flush starts on a fresh cursor
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

    def _insert(self, cur, table, data):
        # `_batch` is registered once on the writer's cursor (_open_cursor)
        # and pointed at each table's rows in turn.
        self._batch.table = data
        try:
            cur.execute(f'INSERT INTO "{table}" BY NAME SELECT * FROM _batch')
        finally:
            self._batch.table = None

    def close(self):
        """Stop the writer, write what is left, close the file."""
        self._stop.set()
        with self._lock:
            self._due.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()
        self._drop_writer()
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
