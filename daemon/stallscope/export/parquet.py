"""Incremental Hive-partitioned Parquet export of one host's database, for fleets.

`export_parquet(con, out_dir, host)` writes `out_dir/table=T/host=H/date=D/`
files that Spark, Trino or DuckDB read as one dataset per table. Raw tables
are sent incrementally: every row carries `stored_ns` (schema/080_export.sql,
CLOCK_REALTIME of the flush that stored or last changed it, strictly
increasing across restarts), and `out_dir/_stallscope/state-H.json` keeps, per
table, the largest `stored_ns` already sent. An export reads one snapshot,
sends the rows above the watermark up to the snapshot's largest value, and
only then moves the watermark: a re-run sends nothing new, an interrupted
run is redone by the next one (its file names depend only on the old
watermark, so the redo replaces them), a late row is sent by the next
export. `date` is the UTC day of `stored_ns`. Rows that were changed (runs,
coverage) are sent again with a larger `stored_ns`: readers keep the latest
version per key (VERSION_KEYS; export/fleet.py does). The derived per-run
tables (step_attribution and the seed views) are sent once a run has ended
and settled, one file per run, replaced if the run's row changes later.
Every file is written under a hidden temporary name, synced, then renamed,
so a reader never sees a partial file. This module never writes to the
database and takes the store's writer lock only to open its snapshot.
"""

import contextlib
import datetime
import fcntl
import itertools
import json
import os
import time
from dataclasses import dataclass, field

import pyarrow.parquet as pq

from stallscope.errors import StallscopeError
from stallscope.store.database import STORED_TABLES

STATE_DIR = "_stallscope"  # Spark and Hive skip names starting with '_'
STATE_VERSION = 1
# The derived tables: one file per ended run (see _export_derived).
DERIVED_VIEWS = ("step_attribution", "seed_gen2", "seed_runs", "seed_slow_steps")
# Tables whose rows change after they are stored: the key of a row, so that
# readers keep only its latest version (the largest stored_ns).
VERSION_KEYS = {
    "runs": ("run_id",),
    "coverage": ("run_id", "probe", "start_ns"),
    "requests": ("run_id", "request_id"),
}
# Columns that would clash with the Hive partition columns (Spark refuses a
# data column named like a partition column): runs.host is the daemon's
# hostname, which the partition `host` replaces.
PARTITION_COLUMNS = ("table", "host", "date")
ROW_GROUP_ROWS = 128 * 1024
# A live daemon's run must have ended this long ago before its derived rows
# are sent: kernel rows of its last moments arrive up to a flush later.
SETTLE_NS = 5_000_000_000


class ExportError(StallscopeError):
    """An export that cannot run (destination, lock, host name)."""

    heading = "export"


@dataclass
class ExportResult:
    host: str
    out_dir: str
    watermark_ns: int = 0  # the largest stored_ns now sent
    rows: dict = field(default_factory=dict)  # table -> rows written this time
    files: int = 0
    runs_derived: list = field(default_factory=list)  # runs whose derived rows were sent

    def summary(self):
        sent = ", ".join(f"{t} {n}" for t, n in sorted(self.rows.items()) if n) or "no new rows"
        return (
            f"exported host {self.host} to {self.out_dir}: {sent}; {self.files} files; "
            f"derived rows of {len(self.runs_derived)} ended runs; watermark {self.watermark_ns}"
        )


def check_host(host):
    """A host name usable as a partition value (also a path part)."""
    if not host or any(c in host for c in "/=\\\0\n") or host.startswith((".", "_")):
        raise ExportError(
            f"unusable host name {host!r} for a partition: give --host NAME "
            "(no '/', '=', leading '.' or '_')"
        )
    return host


def _date(ns):
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc).date().isoformat()


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _AtomicParquet:
    """One Parquet file written under a hidden temporary name and renamed
    into place by `commit()` once complete and synced; `abort()` removes it."""

    def __init__(self, path, schema):
        self.path = path
        self.directory = os.path.dirname(path)
        os.makedirs(self.directory, exist_ok=True)
        self.tmp = os.path.join(self.directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
        self.writer = pq.ParquetWriter(self.tmp, schema, compression="zstd")
        self.rows = 0

    def write(self, batch):
        if batch.num_rows:
            self.writer.write_batch(batch, row_group_size=ROW_GROUP_ROWS)
            self.rows += batch.num_rows

    def commit(self):
        """Returns the rows written (0: no file is left)."""
        self.writer.close()
        if self.rows == 0:
            os.unlink(self.tmp)
            return 0
        with open(self.tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(self.tmp, self.path)
        _fsync_dir(self.directory)
        return self.rows

    def abort(self):
        with contextlib.suppress(Exception):
            self.writer.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


def _write_atomically(path, batches, schema):
    """Write record batches to `path` as one Parquet file, visible only
    complete; returns the rows written (0: no file)."""
    out = _AtomicParquet(path, schema)
    try:
        for batch in batches:
            out.write(batch)
        return out.commit()
    except BaseException:
        out.abort()
        raise


def _write_split_by_run(reader, path_of_run):
    """Batches ordered by run_id, one atomic file per run; returns {run_id: rows}."""
    import pyarrow.compute as pc

    written, out, current = {}, None, None
    try:
        for batch in reader:
            if batch.num_rows == 0:
                continue
            ids = batch.column(batch.schema.get_field_index("run_id"))
            # boundaries where run_id changes (the batch is ordered by it)
            change = pc.not_equal(ids.slice(1), ids.slice(0, len(ids) - 1))
            cuts = [0, *(i + 1 for i in pc.indices_nonzero(change).to_pylist()), len(ids)]
            for lo, hi in itertools.pairwise(cuts):
                run_id = ids[lo].as_py()
                if run_id != current:
                    if out is not None:
                        written[current] = out.commit()
                    out, current = _AtomicParquet(path_of_run(run_id), reader.schema), run_id
                out.write(batch.slice(lo, hi - lo))
        if out is not None:
            written[current] = out.commit()
            out = None
    except BaseException:
        if out is not None:
            out.abort()
        raise
    return written


def _write_json_atomically(path, obj):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


class _Lock:
    """One export per (destination, host) at a time: an flock on a file."""

    def __init__(self, path):
        self.path = path
        self.fd = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise ExportError(
                f"another export to the same directory and host is running ({self.path})"
            ) from None
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def _columns(con, table):
    return [
        r[0]
        for r in con.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = 'main' AND table_name = ? ORDER BY ordinal_position",
            [table],
        ).fetchall()
    ]


def arrow_reader(con, sql, params=(), rows=ROW_GROUP_ROWS):
    """A query's rows as a pyarrow RecordBatchReader, streamed (DuckDB 1.x
    and 2.x spell it differently)."""
    rel = con.sql(sql, params=list(params))
    method = getattr(rel, "to_arrow_reader", None) or rel.record_batch
    return method(rows)


def _select_list(columns):
    return ", ".join(f'"{c}"' for c in columns if c not in PARTITION_COLUMNS)


def load_state(out_dir, host):
    path = os.path.join(out_dir, STATE_DIR, f"state-{host}.json")
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        return {"version": STATE_VERSION, "host": host, "tables": {}, "derived_runs": {}}
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot read the export state {path}: {exc}") from None
    if state.get("version") != STATE_VERSION or state.get("host") != host:
        raise ExportError(f"{path} is not an export state of this release for host {host}")
    return state


def export_parquet(con, out_dir, host, snapshot_lock=None, live=False, now_mono_ns=None):
    """Export what `con` (a connection or cursor on the database) holds and
    `out_dir` lacks. `snapshot_lock`: held while the snapshot opens (the
    daemon's writer lock, so no flush is half committed); `live`: the
    database belongs to a running daemon on this host (runs that ended less
    than SETTLE_NS ago wait for the next export)."""
    host = check_host(host)
    out_dir = os.path.abspath(out_dir)
    try:
        os.makedirs(os.path.join(out_dir, STATE_DIR), exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create {out_dir}: {exc}") from None
    result = ExportResult(host, out_dir)
    with _Lock(os.path.join(out_dir, STATE_DIR, f"state-{host}.lock")):
        state = load_state(out_dir, host)
        with snapshot_lock or contextlib.nullcontext():
            con.execute("BEGIN TRANSACTION")
            present = {
                r[0]
                for r in con.execute(
                    "SELECT table_name FROM information_schema.columns "
                    "WHERE table_schema = 'main' AND column_name = 'stored_ns'"
                ).fetchall()
            }
            tables = [t for t in STORED_TABLES if t in present]
            union = " UNION ALL ".join(f'SELECT max(stored_ns) AS v FROM "{t}"' for t in tables)
            high = con.execute(f"SELECT coalesce(max(v), 0) FROM ({union})").fetchall()[0][0]
        try:
            now_ns = time.time_ns()
            for table in tables:
                result.rows[table] = _export_table(
                    con, out_dir, host, table, state["tables"].get(table), high, now_ns, result
                )
                state["tables"][table] = max(high, state["tables"].get(table) or 0)
            _export_derived(con, out_dir, host, state, live, now_mono_ns, result)
        finally:
            con.execute("ROLLBACK")
        result.watermark_ns = high
        _write_json_atomically(os.path.join(out_dir, STATE_DIR, f"state-{host}.json"), state)
    return result


def _export_table(con, out_dir, host, table, watermark, high, now_ns, result):
    """Rows of `table` with watermark < stored_ns <= high (and, the first
    time, rows without stored_ns), one file per UTC day of stored_ns."""
    cols = _select_list(_columns(con, table))
    if watermark is None:
        where, params = "(stored_ns IS NULL OR stored_ns <= ?)", [high]
        lo = 0
    else:
        where, params = "stored_ns > ? AND stored_ns <= ?", [watermark, high]
        lo = watermark + 1
    days = con.execute(
        f'SELECT DISTINCT coalesce(stored_ns, ?) // 86400000000000 FROM "{table}" WHERE {where}',
        [now_ns, *params],
    ).fetchall()
    rows = 0
    for (day,) in sorted(days):
        reader = arrow_reader(
            con,
            f'SELECT {cols} FROM "{table}" WHERE {where} '
            "AND coalesce(stored_ns, ?) // 86400000000000 = ? ORDER BY stored_ns",
            [*params, now_ns, day],
        )
        path = os.path.join(
            out_dir,
            f"table={table}",
            f"host={host}",
            f"date={_date(day * 86400 * 10**9)}",
            f"part-{lo:019d}.parquet",
        )
        try:
            n = _write_atomically(path, reader, reader.schema)
        finally:
            reader.close()  # an unread result would block the connection's next statement
        rows += n
        result.files += 1 if n else 0
    return rows


def _export_derived(con, out_dir, host, state, live, now_mono_ns, result):
    """Each derived view's rows of every ended run whose runs row changed
    since its derived rows were last sent; one file per run and view,
    replaced when sent again, in the day the run started."""
    have = {
        r[0]
        for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'"
        ).fetchall()
    }
    views = [v for v in DERIVED_VIEWS if v in have]
    if not views or "runs" not in have:
        return
    settled = ""
    params = []
    if live:
        settled = "AND ended_ns <= ?"
        params = [(now_mono_ns or time.monotonic_ns()) - SETTLE_NS]
    runs = con.execute(
        "SELECT run_id, coalesce(stored_ns, 0), coalesce(realtime_ns, stored_ns, 0) FROM runs "
        f"WHERE ended_ns IS NOT NULL {settled} ORDER BY run_id",
        params,
    ).fetchall()
    done = state.setdefault("derived_runs", {})
    pending = [(r, v, t) for r, v, t in runs if done.get(str(r)) != v]
    if not pending:
        return
    day = {r: _date(t) for r, _, t in pending}
    # One query per view for every pending run (the views compute a run's
    # baseline over the whole run; a run_id filter does not reach inside
    # them), cut into one file per run.
    for view in views:
        cols = _select_list(_columns(con, view))
        reader = arrow_reader(
            con,
            f'SELECT {cols} FROM "{view}" WHERE run_id IN (SELECT unnest(?::BIGINT[])) '
            "ORDER BY run_id",
            [[r for r, _, _ in pending]],
        )

        def path_of_run(run_id, view=view):
            return os.path.join(
                out_dir,
                f"table={view}",
                f"host={host}",
                f"date={day[run_id]}",
                f"run-{run_id:012d}.parquet",
            )

        try:
            written = _write_split_by_run(reader, path_of_run)
        finally:
            reader.close()
        result.rows[view] = result.rows.get(view, 0) + sum(written.values())
        result.files += sum(1 for n in written.values() if n)
    for run_id, version, _ in pending:
        done[str(run_id)] = version
        result.runs_derived.append(run_id)
