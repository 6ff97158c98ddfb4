"""Retention: keeps the database under a size and an age limit while the daemon runs.

Every `check_interval_s` a thread (1) deletes whole runs older than
`max_age_days` (by the run's wall-clock start, so the rule holds across
reboots) with their rows in every table that has a `run_id` column, and
kernel and GPU rows (tables with `ts_ns` or `end_ns` and no `run_id`) older
than the age limit on the monotonic clock; (2) while the used size exceeds
`max_db_mb`, deletes the oldest ended runs, each round as many as their
rows' share of the used size says the excess needs (`_trim_to_size`), and
kernel/GPU rows older than the oldest run kept (or, when no ended run is
left, the older half of them); then CHECKPOINTs. It never deletes a run
that is still connected, never holds the writer off longer than one round,
and never deletes anything when no limit is set. The CPU sampler's stacks
and frames (schema 140) are dictionaries, not timed rows: one is deleted
once no sample (stack) uses it and it is older than two id epochs
(`vocab.schema.CPU_STACK_EPOCH_NS`: the sampler never names it again).

What frees space in DuckDB (measured, duckdb 2.0, bench figures in
docs/systemd.md): DELETE alone only grows the WAL; CHECKPOINT turns fully
deleted row groups into free blocks that later inserts reuse, so the file
stops growing; the file itself shrinks only when the free blocks are at its
end. VACUUM does not shrink it. The size limit is therefore on used bytes
(used blocks + WAL), not on the file's length; compacting the file
(`COPY FROM DATABASE` into a new file) needs the daemon stopped.
"""

import logging
import os
import threading
import time

from stallscope import threads
from stallscope.vocab.log_channels import log_channel
from stallscope.vocab.schema import CPU_STACK_EPOCH_NS

log = logging.getLogger(log_channel(__name__))

# Tables with run_id whose rows belong to a run (deleted with it).
# Discovered from the schema, so tables added later are covered too.
# Tables never trimmed by time: bookkeeping the daemon needs.
KEEP_TABLES = {"runs", "probe_status"}
# After exceeding the size limit, trim to this fraction of it so that the
# next check does not immediately trim again.
SIZE_TARGET_FRACTION = 0.9
NS_PER_DAY = 86_400 * 10**9
# (dictionary table, its id, ((table naming ids, that column), ...)), in the
# order they are swept: stacks once no sample names them, then frames once no
# stack and no hang dump (schema 170) does.
DICTIONARY_TABLES = (
    ("cpu_stacks", "stack_id", (("cpu_samples", "stack_id"),)),
    ("cpu_frames", "frame_id", (("cpu_stacks", "frame_id"), ("hang_dump_frames", "frame_id"))),
)


class Limits:
    """The live-changeable limits (SIGHUP replaces the values)."""

    def __init__(self, max_db_mb=0.0, max_age_days=0.0, check_interval_s=300.0):
        self.max_db_mb = float(max_db_mb)
        self.max_age_days = float(max_age_days)
        self.check_interval_s = float(check_interval_s)

    def __repr__(self):
        return (
            f"max_db_mb={self.max_db_mb:g} max_age_days={self.max_age_days:g} "
            f"check_interval_s={self.check_interval_s:g}"
        )


def _block_size(cur):
    return int(cur.execute("SELECT block_size FROM pragma_database_size()").fetchone()[0])


def used_bytes(cur, db_path):
    """Bytes the database really uses: used blocks plus the WAL."""
    c = cur.execute("PRAGMA database_size")
    row = dict(zip([d[0] for d in c.description], c.fetchone(), strict=True))
    used = int(row["used_blocks"]) * int(row["block_size"])
    try:
        used += os.path.getsize(db_path + ".wal")
    except OSError:
        pass
    return used


def file_bytes(db_path):
    total = 0
    for path in (db_path, db_path + ".wal"):
        try:
            total += os.path.getsize(path)
        except OSError:
            pass
    return total


def _tables(cur):
    """(run tables, timed tables as [(table, time column)])."""
    rows = cur.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = 'main' AND table_name IN "
        "(SELECT table_name FROM information_schema.tables "
        " WHERE table_schema = 'main' AND table_type = 'BASE TABLE')"
    ).fetchall()
    columns = {}
    for table, column in rows:
        columns.setdefault(table, set()).add(column)
    run_tables = sorted(
        t for t, cols in columns.items() if "run_id" in cols and t not in KEEP_TABLES
    )
    timed = []
    for t, cols in sorted(columns.items()):
        if "run_id" in cols or t in KEEP_TABLES:
            continue
        for col in ("end_ns", "ts_ns"):
            if col in cols:
                timed.append((t, col))
                break
    return run_tables, timed


class Retention:
    """One check (`check()`), and the thread that runs it periodically."""

    def __init__(self, store, limits, on_runs_deleted=None, after_check=None):
        self.store = store
        self.limits = limits
        self.on_runs_deleted = on_runs_deleted or (lambda run_ids: None)
        self.after_check = after_check  # e.g. the Parquet export (service/export.py)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = None
        self.last = {}  # what the last check did (status, tests)
        self.checks = 0
        self._now_mono = time.monotonic_ns()

    # ----- thread ----------------------------------------------------------------
    def start(self):
        self._thread = threading.Thread(target=self._run, name="retention", daemon=True)
        self._thread.start()

    def wake(self):
        """Check now (after a reload changed the limits)."""
        self._wake.set()

    def stop(self):
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self):
        threads.background("retention")
        while not self._stop.is_set():
            try:
                self.check()
            except Exception as exc:  # retention must never take the daemon down
                log.warning("retention check failed: %s", exc)
            if self.after_check is not None:
                self.after_check()
            self._wake.wait(max(1.0, self.limits.check_interval_s))
            self._wake.clear()

    # ----- one check -------------------------------------------------------------
    def check(self, now_realtime_ns=None, now_mono_ns=None):
        """Apply the limits once; returns a dict of what was done."""
        limits = self.limits
        now_rt = time.time_ns() if now_realtime_ns is None else now_realtime_ns
        now_mono = time.monotonic_ns() if now_mono_ns is None else now_mono_ns
        done = {
            "runs_deleted": [],
            "rows_deleted": 0,
            "before_bytes": None,
            "after_bytes": None,
            "file_bytes": None,
            "checkpointed": False,
        }
        if limits.max_db_mb <= 0 and limits.max_age_days <= 0:
            self.last = done
            return done
        path = self.store.path
        with self.store.exclusive():
            cur = self.store.cursor()
            try:
                run_tables, timed = _tables(cur)
                done["before_bytes"] = used_bytes(cur, path)
                changed = False
                self._now_mono = now_mono
                if limits.max_age_days > 0:
                    age_ns = int(limits.max_age_days * NS_PER_DAY)
                    old = [
                        r[0]
                        for r in cur.execute(
                            "SELECT run_id FROM runs WHERE ended_ns IS NOT NULL "
                            "AND realtime_ns IS NOT NULL AND realtime_ns < ? ORDER BY run_id",
                            [now_rt - age_ns],
                        ).fetchall()
                    ]
                    changed |= self._delete_runs(cur, old, run_tables, done)
                    changed |= self._trim_timed(cur, timed, now_mono - age_ns, done)
                    if changed:
                        self._sweep_dictionaries(cur, now_mono, done)
                if changed:
                    self._checkpoint(cur, done)
                if limits.max_db_mb > 0:
                    limit_b = int(limits.max_db_mb * 1024 * 1024)
                    if used_bytes(cur, path) > limit_b:
                        self._trim_to_size(
                            cur, run_tables, timed, int(limit_b * SIZE_TARGET_FRACTION), done
                        )
                done["after_bytes"] = used_bytes(cur, path)
            finally:
                cur.close()
        done["file_bytes"] = file_bytes(path)
        if done["runs_deleted"] or done["rows_deleted"]:
            log.info(
                "retention (%r): deleted %d runs and %d rows; used %.1f -> %.1f MiB, file %.1f MiB",
                limits,
                len(done["runs_deleted"]),
                done["rows_deleted"],
                done["before_bytes"] / 2**20,
                done["after_bytes"] / 2**20,
                done["file_bytes"] / 2**20,
            )
            self.on_runs_deleted(done["runs_deleted"])
        self.checks += 1
        self.last = done
        return done

    def _trim_to_size(self, cur, run_tables, timed, target_b, done):
        """Delete the oldest ended runs until the used size is under target_b.

        Each round deletes the oldest runs whose rows, at the database's
        bytes per row (used size / rows of every run table, an overestimate
        per run: the schema and the views count too), make up the excess, at
        least one. Space comes back a whole row group at a time, and only at
        a checkpoint no reader's snapshot holds back, so a round may free
        less than its rows' share: then the next round estimates again from
        what is still used. But a round that frees less than one block after
        this check deleted rows enough for its whole excess stops the check:
        the space is on its way back (the next check measures again), and
        deleting more runs for it cannot be undone. (Sizing a round from the
        space the previous one freed failed that way: a round that freed
        almost nothing made one run look a few KiB large, and the next round
        deleted every run.)"""
        rows = self._run_rows(cur, run_tables)
        used = used_bytes(cur, self.store.path)
        total_rows = sum(rows.values())
        per_row = used / total_rows if total_rows else 0.0
        first_excess = used - target_b
        deleted_rows = 0
        for _ in range(64):
            if used <= target_b:
                return
            excess = used - target_b
            ended = [
                r[0]
                for r in cur.execute(
                    "SELECT run_id FROM runs WHERE ended_ns IS NOT NULL ORDER BY run_id"
                ).fetchall()
            ]
            batch, share = [], 0.0
            for run_id in ended:
                batch.append(run_id)
                share += rows.get(run_id, 0) * per_row
                if share >= excess:
                    break
            log.info(
                "retention: %.2f MiB used, target %.2f MiB: deleting runs %s",
                used / 2**20,
                target_b / 2**20,
                batch,
            )
            progressed = False
            if batch:
                progressed |= self._delete_runs(cur, batch, run_tables, done)
                deleted_rows += sum(rows.pop(r, 0) for r in batch)
                oldest_kept = cur.execute("SELECT min(connected_ns) FROM runs").fetchone()[0]
                if oldest_kept is not None:
                    progressed |= self._trim_timed(cur, timed, oldest_kept, done)
                else:
                    progressed |= self._trim_half(cur, timed, done)
            else:
                progressed |= self._trim_half(cur, timed, done)
            if progressed:
                self._sweep_dictionaries(cur, self._now_mono, done)
            self._checkpoint(cur, done)
            if not progressed:
                log.warning(
                    "database is over its size limit (%.1f MiB) but only connected "
                    "runs are left to delete",
                    target_b / SIZE_TARGET_FRACTION / 2**20,
                )
                return
            before, used = used, used_bytes(cur, self.store.path)
            if before - used < _block_size(cur) and deleted_rows * per_row >= first_excess:
                log.info(
                    "retention: deleted rows enough for %.2f MiB, %.2f MiB freed so far; "
                    "the rest comes back at a later checkpoint",
                    first_excess / 2**20,
                    (done["before_bytes"] or before) / 2**20 - used / 2**20,
                )
                return

    @staticmethod
    def _run_rows(cur, run_tables):
        """{run_id: its rows in every run table}."""
        rows = {}
        for table in run_tables:
            for run_id, n in cur.execute(
                f'SELECT run_id, count(*) FROM "{table}" GROUP BY run_id'
            ).fetchall():
                rows[run_id] = rows.get(run_id, 0) + n
        return rows

    def _delete_runs(self, cur, run_ids, run_tables, done):
        if not run_ids:
            return False
        cur.execute("BEGIN TRANSACTION")
        try:
            for table in run_tables:
                n = cur.execute(
                    f'DELETE FROM "{table}" WHERE run_id IN (SELECT unnest(?::BIGINT[]))', [run_ids]
                ).fetchone()[0]
                done["rows_deleted"] += n
            cur.execute(
                "DELETE FROM runs WHERE run_id IN (SELECT unnest(?::BIGINT[])) "
                "AND ended_ns IS NOT NULL",
                [run_ids],
            )
            cur.execute("COMMIT")
        except Exception:
            cur.execute("ROLLBACK")
            raise
        done["runs_deleted"].extend(run_ids)
        return True

    @staticmethod
    def _trim_timed(cur, timed, cutoff_ns, done):
        deleted = 0
        for table, col in timed:
            # min() is answered from zone maps; skip the scanning DELETE when
            # nothing is old enough (the common case at each check).
            oldest = cur.execute(f'SELECT min("{col}") FROM "{table}"').fetchone()[0]
            if oldest is None or oldest >= cutoff_ns:
                continue
            deleted += cur.execute(
                f'DELETE FROM "{table}" WHERE "{col}" < ?', [int(cutoff_ns)]
            ).fetchone()[0]
        done["rows_deleted"] += deleted
        return deleted > 0

    @staticmethod
    def _sweep_dictionaries(cur, now_mono, done):
        """Delete stacks no sample names and frames no stack names, older
        than two id epochs (the CPU sampler may still name younger ones)."""
        tables = {
            r[0]
            for r in cur.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'"
            ).fetchall()
        }
        cutoff = int(now_mono - 2 * CPU_STACK_EPOCH_NS)
        deleted = 0
        for table, key, users in DICTIONARY_TABLES:
            users = [(u, k) for u, k in users if u in tables]
            if table not in tables or not users:
                continue
            named = " UNION ALL ".join(
                f'SELECT "{k}" FROM "{u}" WHERE "{k}" IS NOT NULL' for u, k in users
            )
            deleted += cur.execute(
                f'DELETE FROM "{table}" WHERE first_ts_ns < ? AND "{key}" NOT IN ({named})',
                [cutoff],
            ).fetchone()[0]
        done["rows_deleted"] += deleted
        return deleted > 0

    @staticmethod
    def _trim_half(cur, timed, done):
        deleted = 0
        for table, col in timed:
            median = cur.execute(f'SELECT quantile_disc("{col}", 0.5) FROM "{table}"').fetchone()[0]
            if median is None:
                continue
            n = cur.execute(f'DELETE FROM "{table}" WHERE "{col}" <= ?', [median]).fetchone()[0]
            deleted += n
        done["rows_deleted"] += deleted
        return deleted > 0

    @staticmethod
    def _checkpoint(cur, done):
        try:
            cur.execute("CHECKPOINT")
            done["checkpointed"] = True
        except Exception as exc:  # an API reader's open transaction: next round
            log.info("checkpoint deferred: %s", exc)
