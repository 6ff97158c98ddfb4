"""Keeps `step_components` filled: each step's attribution components, computed once.

`step_attribution` would otherwise join every kernel row with every step on
each query. The filler stores, per closed step, what `_step_components` and
`_step_submit_call` give for it (the same SQL: `_step_components_of(true)`,
the views' own scoped computation), and the views read stored rows for
filled steps and compute only the rest. A step is filled once it has
settled: it ended `settle_ns` ago (kernel ring buffers drain late) and the
lock chains of its off-CPU rows are closed (a later row of its thread
begins a new chain). A thread's filled steps are always a prefix of its
steps (0..filled_idx in step_component_threads), so the views need no
per-step anti-join. Rows that arrive late anyway (a row that starts before
a thread's `safe_ns`, a new run whose pid earlier rows named) take the
thread back to before the lock chain they touch: its rows from there on
are deleted and filled again. The filler never writes a source table, and
a failed cycle only leaves steps to the views' own computation.
"""

import logging
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallscope import threads
from stallscope.vocab.log_channels import log_channel
from stallscope.vocab.schema import STEP_FILL_VERSION

log = logging.getLogger(log_channel(__name__))

NS_MIN = -(2**63)
# The source tables whose late rows can change a filled step, and the
# column of each row's start. Kernel rows name a (pid, tid); GC rows a run
# (a pass stops every thread of it); spans a (run, tid).
KERNEL_SOURCES = {
    "offcpu": "start_ns",
    "runq": "start_ns",
    "migrations": "ts_ns",
    "syscalls": "start_ns",
    "page_faults": "start_ns",
    "irq_time": "start_ns",
    "cuda_calls": "start_ns",
}
RUN_SOURCES = {"gc_events": ("run_id",), "spans": ("run_id", "tid")}
# Threads filled per cycle: each costs a few small queries, so a database
# with very many step threads is filled over several cycles, never in one
# long one.
MAX_THREADS_PER_CYCLE = 64
# A backlog (a database filled by an older release, a daemon that was
# down) is filled this much run time per cycle, so that a cycle's memory
# stays within the daemon's DuckDB limit; cycles then follow each other
# after BACKLOG_PAUSE_S.
BACKLOG_SLICE_NS = 60_000_000_000
BACKLOG_PAUSE_S = 0.5
# Longest wait between cycles after failures (doubling from the interval).
MAX_RETRY_S = 600.0
# A cycle's CPU is a fixed ~0.2 s on a 2-vCPU VM whatever its size (binding,
# optimising and starting the ~500 operators of the fill statement; 200
# steps cost what 4,000 do), so cycles are spaced by what the last one cost:
# after a cycle of c CPU-seconds the next waits c / cpu_share (0.1 % of a
# core: ~200 s here), never less than the interval nor more than this.
# Steps not filled yet are computed when read (~4 us each per query).
MAX_PACED_WAIT_S = 600.0

# Off-CPU rows that take part in lock chains (_offcpu_event's `vol`).
_VOL = (
    "end_ns > start_ns AND resolution_ns IS NULL AND (wakeup_ns IS NOT NULL "
    "OR waker_tid IS NOT NULL OR waker_irq OR preemptor_pid IS NOT NULL)"
)

# Per step thread with unfilled steps: the last index that may be filled
# (its end settled), from the unfilled steps alone.
_TODO_SQL = """
SELECT run_id, tid, any_value(pid) AS pid, min(step_idx) AS first_idx,
       max(step_idx) AS last_idx, max(step_idx) FILTER (end_ns <= ?) AS settled_idx
FROM _step_todo GROUP BY run_id, tid
ORDER BY settled_idx IS NULL, min(start_ns)
"""

# One statement per cycle (its planning is most of a cycle's cost): the
# components, the submit calls and the CPU samples of the steps to fill.
_FILL_SQL = f"""
INSERT INTO step_components BY NAME
WITH c AS MATERIALIZED (SELECT * FROM _step_components_of(true)),
sc AS MATERIALIZED (SELECT * FROM _step_submit_call_of(true)),
cp AS MATERIALIZED (SELECT * FROM _step_cpu_of(true))
SELECT s.run_id, s.tid, s.step_idx, s.pid, s.start_ns, s.end_ns,
       c.run_id IS NOT NULL AS has_components,
       sc.submit_ns, sc.submit_start_ns, sc.submit_end_ns, sc.submit_calls,
       c.* EXCLUDE (run_id, tid, step_idx),
       cp.* EXCLUDE (run_id, tid, step_idx),
       ?::BIGINT AS lock_chain_gap_ns, ?::BIGINT AS filled_ns,
       {STEP_FILL_VERSION}::INTEGER AS fill_version
FROM _step_todo s
JOIN _fill_limit l ON l.run_id = s.run_id AND l.tid = s.tid AND s.step_idx <= l.fill_idx
LEFT JOIN c ON c.run_id = s.run_id AND c.tid = s.tid AND c.step_idx = s.step_idx
LEFT JOIN sc ON sc.run_id = s.run_id AND sc.tid = s.tid AND sc.step_idx = s.step_idx
LEFT JOIN cp ON cp.run_id = s.run_id AND cp.tid = s.tid AND cp.step_idx = s.step_idx
"""


def _min_per_key(batch, keys, col):
    """[(key..., min of col)] per distinct key (one or two key columns) of a
    batch, in numpy: this runs on the producers' threads for every batch, and
    pyarrow's group_by cost ~1 ms a batch there (a third of the sched
    reader's CPU)."""
    if batch[col].null_count:
        batch = batch.filter(pc.is_valid(batch[col]))
        if batch.num_rows == 0:
            return []
    parts = [batch[k].to_numpy(zero_copy_only=False).astype(np.int64) for k in keys]
    starts = batch[col].to_numpy(zero_copy_only=False).astype(np.int64)
    if all((p == p[0]).all() for p in parts):  # the usual case: one thread
        return [(*(int(p[0]) for p in parts), int(starts.min()))]
    uniq, inverse = np.unique(np.stack(parts, axis=1), axis=0, return_inverse=True)
    mins = np.full(len(uniq), np.iinfo(np.int64).max)
    np.minimum.at(mins, inverse.ravel(), starts)
    return [(*key, m) for key, m in zip(uniq.tolist(), mins.tolist(), strict=True)]


class StepFiller:
    """Fills step_components from a cursor of the daemon's database."""

    def __init__(self, store, interval_s=60.0, settle_ns=2_000_000_000, cpu_share=0.001):
        self.store = store
        self.interval_s = interval_s
        self.cpu_share = cpu_share  # of one core, for cycles that fill (see MAX_PACED_WAIT_S)
        self.settle_ns = int(settle_ns)
        self._lock = threading.Lock()
        self._late = {}  # ('k', pid, tid) | ('r', run_id) | ('s', run_id, tid) -> min start
        self._dirty = True  # spans arrived (or start-up): steps may be waiting
        self._more = True  # the last fill left steps to settle
        self.backlog = False  # the last fill stopped at its slice: more right away
        self._slice_ns = BACKLOG_SLICE_NS  # doubled while a slice fills nothing
        self._last_run_id = None
        self._stop = threading.Event()
        self._thread = None
        self._cur = None  # the cursor of the cycle in progress (stop() interrupts it)
        self.cycles = 0
        self.last_cycle_cpu_s = None  # thread CPU of the last cycle that filled
        self.steps_filled = 0
        self.steps_reset = 0
        self.last_error = None

    # ----- store listener (producer threads: keep it small) -----------------
    def note_batch(self, table, batch):
        """Remember the earliest row per key of a stored batch (late-row check)."""
        if table in KERNEL_SOURCES:
            # off-CPU rows can also join a lock chain: they have their own threshold
            keys, tag = ["pid", "tid"], ("o" if table == "offcpu" else "k")
            col = KERNEL_SOURCES[table]
        elif table in RUN_SOURCES:
            keys, tag, col = list(RUN_SOURCES[table]), ("r" if table == "gc_events" else "s"), None
            col = "start_ns"
        else:
            return
        if batch.num_rows == 0 or any(k not in batch.column_names for k in keys + [col]):
            return
        rows = _min_per_key(batch, keys, col)
        with self._lock:
            if table == "spans":
                self._dirty = True
            for *key, start in rows:
                if start is None:
                    continue
                k = (tag, *key)
                old = self._late.get(k)
                if old is None or start < old:
                    self._late[k] = start

    @staticmethod
    def forget_old_versions(cur):
        """Delete stored steps written by an older filler (their rows lack
        columns added since): they are filled again, as a backlog. Returns
        the steps deleted."""
        old = "coalesce(fill_version, 0) < ?"
        if not cur.execute(
            f"SELECT count(*) FROM step_component_threads WHERE {old}", [STEP_FILL_VERSION]
        ).fetchone()[0]:
            return 0
        cur.execute("BEGIN TRANSACTION")
        try:
            n = cur.execute(
                f"DELETE FROM step_components WHERE {old}", [STEP_FILL_VERSION]
            ).fetchone()[0]
            cur.execute(f"DELETE FROM step_component_threads WHERE {old}", [STEP_FILL_VERSION])
            cur.execute("COMMIT")
        except Exception:
            cur.execute("ROLLBACK")
            raise
        log.info("step_components: %d steps of an older release are filled again", n)
        return n

    # ----- thread ---------------------------------------------------------------
    def start(self):
        cur = self.store.cursor()
        try:  # runs stored before this start were known when their steps were filled
            self._last_run_id = cur.execute("SELECT max(run_id) FROM runs").fetchone()[0]
            self.steps_reset += self.forget_old_versions(cur)
        finally:
            cur.close()
        self.store.add_listener(self.note_batch)
        self._thread = threading.Thread(target=self._run, name="step-fill", daemon=True)
        self._thread.start()

    def stop(self):
        """Stop the thread; a cycle in progress is interrupted (it rolls back)."""
        self._stop.set()
        self.store.remove_listener(self.note_batch)
        cur = self._cur
        if cur is not None:
            try:
                cur.interrupt()
            except Exception:
                pass
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self):
        threads.background("step-fill")
        wait_s = self.interval_s
        while not self._stop.wait(wait_s):
            threads.dodge_step_threads()  # a cycle is a burst of 0.1-0.4 s of CPU
            try:
                cpu0 = time.thread_time()
                filled = self.cycle()
                if filled:
                    self.last_cycle_cpu_s = time.thread_time() - cpu0
                wait_s = BACKLOG_PAUSE_S if self.backlog else self.paced_wait_s()
            except Exception as exc:  # the daemon runs on; the views compute the rest
                if self._stop.is_set():
                    break  # interrupted by stop(): the cycle rolled back
                self.last_error = str(exc)
                # a cycle that fails (e.g. out of memory on a large backlog)
                # is not retried at full rate
                wait_s = min(wait_s * 2, MAX_RETRY_S)
                log.warning("step_components fill failed (next try in %.0f s): %s", wait_s, exc)

    def paced_wait_s(self):
        """The wait before the next cycle: the interval, or longer so that
        cycles that fill stay within `cpu_share` of a core."""
        if not self.last_cycle_cpu_s or self.cpu_share >= 1:
            return self.interval_s
        paced = min(self.last_cycle_cpu_s / self.cpu_share, MAX_PACED_WAIT_S)
        return max(self.interval_s, paced)

    # ----- one cycle ----------------------------------------------------------
    def cycle(self, now_ns=None):
        """Apply late rows, then fill the settled steps. Returns steps filled."""
        with self._lock:
            late, self._late = self._late, {}
            dirty, self._dirty = self._dirty, False
        # Rows noted so far are in the database once this returns; rows noted
        # later are checked next cycle, even if this cycle already saw them.
        self.store.flush()
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        cur = self._cur = self.store.cursor()
        try:
            gap_ns = cur.execute("SELECT lock_chain_gap_ns FROM step_params").fetchone()[0]
            self._apply_late(cur, late, gap_ns)
            if not dirty and not self._more and not self.backlog and not late:
                return 0  # nothing arrived and nothing waits: no work while idle
            filled, self._more = self._fill(cur, now_ns, gap_ns)
            self.cycles += 1
            return filled
        finally:
            self._cur = None
            cur.close()

    def _fill(self, cur, now_ns, gap_ns):
        first = cur.execute("SELECT first_ns FROM _step_todo_bound").fetchone()[0]
        until = min(first + self._slice_ns, 2**63 - 1)
        self.backlog = until < now_ns - self.settle_ns
        # this cursor's views see the steps (and off-CPU rows) starting up to `until` only
        cur.execute("SET VARIABLE _step_fill_until_ns = ?", [until])
        try:
            filled, more = self._fill_until(cur, now_ns, gap_ns, until)
        finally:
            cur.execute("RESET VARIABLE _step_fill_until_ns")
        # a slice whose lock chains all run past its end fills nothing: widen it
        self._slice_ns = self._slice_ns * 2 if self.backlog and not filled else BACKLOG_SLICE_NS
        return filled, more

    def _fill_until(self, cur, now_ns, gap_ns, until):
        settled_ns = min(until, now_ns - self.settle_ns)
        todo = cur.execute(_TODO_SQL, [settled_ns]).fetchall()
        limits, more = [], len(todo) > MAX_THREADS_PER_CYCLE
        for run_id, tid, pid, first_idx, last_idx, settled_idx in todo[:MAX_THREADS_PER_CYCLE]:
            more = more or settled_idx != last_idx
            if settled_idx is None:
                continue
            cut = self._cut_of(cur, run_id, tid)
            closed = self._last_chain_begin(
                cur, pid, tid, cut, until, gap_ns, now_ns - self.settle_ns
            )
            fill_idx = settled_idx
            if closed is not None:  # the thread has chain rows: fill up to the last closed chain
                row = cur.execute(
                    "SELECT max(step_idx) FROM _step_todo WHERE run_id = ? AND tid = ? "
                    "AND step_idx <= ? AND end_ns <= ?",
                    [run_id, tid, settled_idx, closed],
                ).fetchone()
                fill_idx = row[0]
            more = more or fill_idx != last_idx
            if fill_idx is not None and fill_idx >= first_idx:
                limits.append((run_id, tid, pid, fill_idx))
        if not limits:
            return 0, more
        table = pa.table(
            {
                "run_id": pa.array([x[0] for x in limits], pa.int64()),
                "tid": pa.array([x[1] for x in limits], pa.int64()),
                "fill_idx": pa.array([x[3] for x in limits], pa.int64()),
            }
        )
        cur.execute("BEGIN TRANSACTION")
        try:
            cur.register("_fill_limit", table)
            n = cur.execute(_FILL_SQL, [gap_ns, now_ns]).fetchone()[0]
            cur.unregister("_fill_limit")
            for run_id, tid, pid, fill_idx in limits:
                self._set_frontier(cur, run_id, tid, pid, fill_idx, gap_ns, now_ns)
            cur.execute("COMMIT")
        except Exception:
            cur.execute("ROLLBACK")
            raise
        self.steps_filled += n
        return n, more

    # ----- frontier -------------------------------------------------------------
    @staticmethod
    def _cut_of(cur, run_id, tid):
        row = cur.execute(
            "SELECT chain_cut_ns FROM step_component_threads WHERE run_id = ? AND tid = ?",
            [run_id, tid],
        ).fetchone()
        return NS_MIN if row is None or row[0] is None else row[0]

    @staticmethod
    def _last_chain_begin(cur, pid, tid, from_ns, upto_ns, gap_ns, settled_ns):
        """Start of the thread's last lock-chain begin in [from_ns, upto_ns]
        (from_ns is a chain boundary): a chain row more than gap_ns after its
        predecessor, or the first row; the chains before it are closed.
        +inf when the thread has no chain rows there, or when its last chain
        row of all starts by upto_ns and ended more than gap_ns before
        settled_ns: a row that extends it now is a late row, which takes its
        steps back."""
        row = cur.execute(
            f"""SELECT count(*) FILTER (start_ns <= ?),
                       max(start_ns) FILTER ((gap > ? OR gap IS NULL) AND start_ns <= ?),
                       max(end_ns), max(start_ns) FROM (
                SELECT start_ns, end_ns, start_ns - lag(end_ns) OVER (ORDER BY start_ns) AS gap
                FROM offcpu WHERE pid = ? AND tid = ? AND start_ns >= ? AND {_VOL})""",
            [upto_ns, gap_ns, upto_ns, pid, tid, from_ns],
        ).fetchone()
        count, begin, last_end, last_start = row
        if count == 0:
            return 2**63 - 1
        if last_start <= upto_ns and last_end + gap_ns < settled_ns:
            return 2**63 - 1
        return begin

    @staticmethod
    def _chain_begin_at_or_before(cur, pid, tid, at_ns, gap_ns):
        """Start of the latest lock-chain begin at or before at_ns (a chain row
        more than gap_ns after its predecessor, or the thread's first); at_ns
        itself when no chain row starts at or before it (rows from at_ns on
        then see no chain before them either). Searches back in doubling windows."""
        window = 10_000_000_000
        while True:
            lo = max(at_ns - window, NS_MIN)
            row = cur.execute(
                f"""SELECT count(*), max(start_ns) FILTER (gap > ?),
                           (SELECT count(*) FROM offcpu WHERE pid = ? AND tid = ? AND start_ns < ?
                            AND {_VOL})
                    FROM (SELECT start_ns, start_ns - lag(end_ns) OVER (ORDER BY start_ns) AS gap
                          FROM offcpu WHERE pid = ? AND tid = ? AND start_ns >= ?
                          AND start_ns <= ? AND {_VOL})""",
                [gap_ns, pid, tid, lo, pid, tid, lo, at_ns],
            ).fetchone()
            found, begin, earlier = row
            if begin is not None:
                return begin
            if earlier == 0:  # the window holds the thread's first chain row (or none)
                if found == 0:
                    return at_ns
                return cur.execute(
                    f"SELECT min(start_ns) FROM offcpu WHERE pid = ? AND tid = ? AND start_ns >= ? "
                    f"AND {_VOL}",
                    [pid, tid, lo],
                ).fetchone()[0]
            if lo == NS_MIN:
                return at_ns
            window *= 2

    def _set_frontier(self, cur, run_id, tid, pid, filled_idx, gap_ns, now_ns):
        """Write the thread's frontier for steps 0..filled_idx filled (-1: none)."""
        cur.execute(
            "DELETE FROM step_component_threads WHERE run_id = ? AND tid = ?", [run_id, tid]
        )
        if filled_idx < 0:
            return
        start_ns, end_ns = cur.execute(
            "SELECT start_ns, end_ns FROM step_components WHERE run_id = ? AND tid = ? "
            "AND step_idx = ?",
            [run_id, tid, filled_idx],
        ).fetchone()
        # Unfilled steps start at or after the last filled one's end (steps
        # of a thread do not overlap); a zero-length last step is not its own successor.
        todo_from = end_ns if end_ns > start_ns else end_ns + 1
        # Off-CPU rows that may overlap an unfilled step end after todo_from;
        # the cut is the begin of the lock chain of the earliest of them.
        first = cur.execute(
            "SELECT min(start_ns) FROM offcpu WHERE pid = ? AND tid = ? AND end_ns > ?",
            [pid, tid, todo_from],
        ).fetchone()[0]
        at = todo_from if first is None else min(todo_from, first)
        cut = self._chain_begin_at_or_before(cur, pid, tid, at, gap_ns)
        # A row starting before safe could overlap a filled step or join the
        # lock chain of one of its rows: the first chain begin after the
        # filled steps, else (the last chain is closed only by time) just
        # past the reach of the thread's last chain row.
        safe, last_end = cur.execute(
            f"""SELECT min(start_ns) FILTER ((gap > ? OR gap IS NULL) AND start_ns >= ?), max(end_ns)
                FROM (SELECT start_ns, end_ns, start_ns - lag(end_ns) OVER (ORDER BY start_ns) AS gap
                      FROM offcpu WHERE pid = ? AND tid = ? AND start_ns >= ? AND {_VOL})""",
            [gap_ns, end_ns, pid, tid, cut],
        ).fetchone()
        if safe is None:
            safe = end_ns if last_end is None else max(end_ns, last_end + gap_ns + 1)
        cur.execute(
            "INSERT INTO step_component_threads (run_id, tid, pid, filled_idx, todo_from_ns, "
            "chain_cut_ns, safe_ns, lock_chain_gap_ns, updated_ns, fill_version) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [run_id, tid, pid, filled_idx, todo_from, cut, safe, gap_ns, now_ns, STEP_FILL_VERSION],
        )

    # ----- late rows -----------------------------------------------------------
    def _apply_late(self, cur, late, gap_ns):
        """Take threads back before the lock chain a late row touches."""
        frontier = cur.execute(
            "SELECT run_id, tid, pid, todo_from_ns, safe_ns FROM step_component_threads"
        ).fetchall()
        if not frontier:
            self._last_run_id = cur.execute("SELECT max(run_id) FROM runs").fetchone()[0]
            return
        resets = {}  # (run_id, tid) -> earliest start of a late row

        def reset(thread, at):
            if at < resets.get(thread, 2**63):
                resets[thread] = at

        for run_id, tid, pid, todo_from, safe in frontier:
            # a row starting before todo_from may overlap a filled step; an
            # off-CPU row before safe may also join the lock chain of one's row
            for key, limit in (
                (("o", pid, tid), safe),
                (("k", pid, tid), todo_from),
                (("r", run_id), todo_from),
                (("s", run_id, tid), todo_from),
            ):
                at = late.get(key)
                if at is not None and at < limit:
                    reset((run_id, tid, pid), at)
        # A new run makes its pid a traced process: earlier off-CPU rows that
        # named it now read as 'peer' and carry its run.
        last = self._last_run_id if self._last_run_id is not None else -1
        new_runs = cur.execute("SELECT run_id, pid FROM runs WHERE run_id > ?", [last]).fetchall()
        for new_run_id, pid in new_runs:
            self._last_run_id = max(new_run_id, last)
            last = self._last_run_id
            for run_id, tid, tpid, at in cur.execute(
                "SELECT run_id, tid, pid, min(start_ns) FROM step_components "
                "WHERE list_contains(who_pids, ?) AND pid IS DISTINCT FROM ? GROUP BY ALL",
                [pid, pid],
            ).fetchall():
                reset((run_id, tid, tpid), at)
        if not resets:
            return
        cur.execute("BEGIN TRANSACTION")
        try:
            for (run_id, tid, pid), at in resets.items():
                begin = self._chain_begin_at_or_before(cur, pid, tid, at, gap_ns)
                begin = min(begin, at)
                n = cur.execute(
                    "DELETE FROM step_components WHERE run_id = ? AND tid = ? AND end_ns > ?",
                    [run_id, tid, begin],
                ).fetchone()[0]
                self.steps_reset += n
                last = cur.execute(
                    "SELECT coalesce(max(step_idx), -1) FROM step_components "
                    "WHERE run_id = ? AND tid = ?",
                    [run_id, tid],
                ).fetchone()[0]
                self._set_frontier(cur, run_id, tid, pid, last, gap_ns, time.monotonic_ns())
            cur.execute("COMMIT")
        except Exception:
            cur.execute("ROLLBACK")
            raise
        log.debug("step_components: late rows took %d threads back", len(resets))
