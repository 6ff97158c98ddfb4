"""Fan-out of stored batches to live subscribers, with bounded queues.

The store calls `Fanout.on_batch(table, pa.Table)` on the producer's thread
(ingest's decode loop, a probe's reader) for every batch it queues. That
call must never block or do real work: it only appends a reference to each
interested subscriber's queue, or, when the queue already holds its bound
of rows, counts the batch's rows (after that subscriber's filters) as
dropped. A loss is queued as a `DropMark` in its place among the queued
batches (consecutive losses merge into one mark), with the lost events'
time range and kinds, so the stream can say exactly where it lost what.
Filtering and protobuf conversion happen on the subscriber's own thread
(its gRPC stream), so a slow or stalled subscriber loses its own events, is
told so in-stream, and costs ingest and the other subscribers nothing. It
never copies a batch and never touches the database.
"""

import threading
import time
from collections import deque

import pyarrow as pa
import pyarrow.compute as pc

from stallscope.vocab import event_kinds
from stallscope.vocab.event_kinds import ALL_KINDS, INTERVAL_KINDS, RUN_KINDS, TABLE_KINDS

DEFAULT_QUEUE_EVENTS = 50_000
MAX_QUEUE_EVENTS = 1_000_000


class Filter:
    """What one subscriber asked for."""

    def __init__(self, kinds=(), span_kinds=(), run_ids=(), pids=(), min_duration_ns=0):
        self.kinds = frozenset(kinds) or ALL_KINDS
        self.span_kinds = list(span_kinds)
        self.run_ids = set(run_ids)
        self.pids = set(pids)
        self.min_duration_ns = int(min_duration_ns or 0)

    def apply(self, kind, batch, runs):
        """The rows of `batch` this subscriber wants (`runs`: run_id -> pid)."""
        mask = None

        def both(m):
            return m if mask is None else pc.and_(mask, m)

        if kind == event_kinds.SPAN and self.span_kinds:
            mask = both(pc.is_in(batch["kind"], value_set=pa.array(self.span_kinds)))
        if self.min_duration_ns and kind in INTERVAL_KINDS:
            dur = pc.subtract(batch["end_ns"], batch["start_ns"])
            mask = both(pc.greater_equal(dur, self.min_duration_ns))
        if self.run_ids:
            if kind in RUN_KINDS:
                mask = both(
                    pc.is_in(
                        batch["run_id"].cast(pa.int64()),
                        value_set=pa.array(sorted(self.run_ids), pa.int64()),
                    )
                )
            elif kind != event_kinds.GPU_SAMPLE:
                pids = sorted({runs.get(r) for r in self.run_ids} - {None})
                mask = both(
                    pc.is_in(batch["pid"].cast(pa.int64()), value_set=pa.array(pids, pa.int64()))
                )
        if self.pids:
            if kind in RUN_KINDS:
                run_ids = sorted(r for r, p in runs.items() if p in self.pids)
                mask = both(
                    pc.is_in(
                        batch["run_id"].cast(pa.int64()), value_set=pa.array(run_ids, pa.int64())
                    )
                )
            elif kind != event_kinds.GPU_SAMPLE:
                mask = both(
                    pc.is_in(
                        batch["pid"].cast(pa.int64()),
                        value_set=pa.array(sorted(self.pids), pa.int64()),
                    )
                )
        if mask is None:
            return batch
        return batch.filter(pc.fill_null(mask, False))


class DropMark:
    """Events lost at one place in a subscriber's queue (merged while last)."""

    __slots__ = ("count", "total", "from_ns", "to_ns", "kinds")

    def __init__(self):
        self.count = 0
        self.total = 0
        self.from_ns = None
        self.to_ns = None
        self.kinds = set()

    def add(self, kind, lost, total):
        self.count += lost.num_rows
        self.total = total
        self.kinds.add(kind)
        try:
            first, last = time_range(kind, lost)
        except Exception:
            return
        if first is not None:
            self.from_ns = first if self.from_ns is None else min(self.from_ns, first)
        if last is not None:
            self.to_ns = last if self.to_ns is None else max(self.to_ns, last)


def time_range(kind, batch):
    """(earliest start, latest end) of a batch's events, ns; None when unknown."""
    if kind in event_kinds.POINT_KINDS:
        start, end = "ts_ns", "ts_ns"
    else:
        start, end = "start_ns", "end_ns"
    if start not in batch.column_names or end not in batch.column_names:
        return None, None
    return pc.min(batch[start]).as_py(), pc.max(batch[end]).as_py()


class Subscriber:
    """One stream's bounded queue of (kind, pa.Table) references."""

    def __init__(self, flt, max_queue_events=0, name=""):
        self.filter = flt
        self.name = name
        cap = (
            max_queue_events if max_queue_events and max_queue_events > 0 else DEFAULT_QUEUE_EVENTS
        )
        self.max_queue_events = min(cap, MAX_QUEUE_EVENTS)
        self._queue = deque()
        self._queued_rows = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self.dropped_pending = 0  # lost since the last Dropped notice
        self.dropped_total = 0
        self.closed = False
        self.seq = 0

    def offer(self, kind, batch, runs):
        """Producer side: queue or count as dropped. Never blocks on the consumer."""
        n = batch.num_rows
        with self._lock:
            if self._queued_rows + n <= self.max_queue_events:
                self._queue.append((kind, batch))
                self._queued_rows += n
                dropped = 0
            else:
                dropped = None
        if dropped is None:
            # The slow path, only when this subscriber is already behind:
            # count what it would have received, not what others wanted.
            try:
                lost = self.filter.apply(kind, batch, runs)
            except Exception:
                lost = batch
            if not lost.num_rows:
                return
            with self._lock:
                self.dropped_pending += lost.num_rows
                self.dropped_total += lost.num_rows
                mark = self._queue[-1] if self._queue else None
                if not isinstance(mark, DropMark):
                    mark = DropMark()
                    self._queue.append(mark)
                mark.add(kind, lost, self.dropped_total)
        self._wake.set()

    def take_ordered(self, timeout_s):
        """Consumer side: queued (kind, batch) items and DropMarks, in the
        order they happened; waits up to timeout_s for the first."""
        self._wake.wait(timeout_s)
        with self._lock:
            self._wake.clear()
            items = list(self._queue)
            self._queue.clear()
            self._queued_rows = 0
            self.dropped_pending = 0
        return items

    def take(self, timeout_s):
        """Consumer side: ((kind, batch) items, events dropped since last time)."""
        items = self.take_ordered(timeout_s)
        batches = [i for i in items if not isinstance(i, DropMark)]
        dropped = sum(i.count for i in items if isinstance(i, DropMark))
        return batches, dropped

    def close(self):
        self.closed = True
        self._wake.set()


class Fanout:
    """Every live subscriber, and the store listener that feeds them."""

    def __init__(self, run_pids=None):
        # run_pids(): {run_id: pid} from ingest (refreshed when a run is new).
        self._run_pids = run_pids or (lambda: {})
        self._subscribers = ()  # replaced, never mutated: producers iterate it
        self._lock = threading.Lock()
        self.runs = {}
        self._runs_checked = 0.0
        self.dropped_closed = 0  # drops of streams that have ended

    # ----- producer side ----------------------------------------------------------
    def on_batch(self, table, batch):
        kind = TABLE_KINDS.get(table)
        if kind is None:
            return
        for sub in self._subscribers:
            if kind in sub.filter.kinds:
                sub.offer(kind, batch, self.runs)

    # ----- subscribers --------------------------------------------------------------
    def subscribe(self, flt, max_queue_events=0, name=""):
        sub = Subscriber(flt, max_queue_events, name)
        self.refresh_runs(force=True)
        with self._lock:
            self._subscribers = self._subscribers + (sub,)
        return sub

    def unsubscribe(self, sub):
        sub.close()
        with self._lock:
            self._subscribers = tuple(s for s in self._subscribers if s is not sub)
            self.dropped_closed += sub.dropped_total

    def close_all(self):
        for sub in self._subscribers:
            sub.close()

    @property
    def subscribers(self):
        return self._subscribers

    def dropped_total(self):
        return self.dropped_closed + sum(s.dropped_total for s in self._subscribers)

    def runs_for(self, items):
        """run -> pid for these queued items: re-read at once when one of
        them names a run not yet known (a run's first records can reach the
        stream a few ms after its hello, sooner than the periodic refresh)."""
        runs = self.refresh_runs()
        for item in items:
            if isinstance(item, DropMark):
                continue
            kind, batch = item
            if kind in RUN_KINDS and "run_id" in batch.column_names:
                known = pc.is_in(
                    batch["run_id"].cast(pa.int64()), value_set=pa.array(list(runs), pa.int64())
                )
                if not pc.all(pc.fill_null(known, True)).as_py():
                    return self.refresh_runs(force=True)
        return runs

    def refresh_runs(self, force=False):
        """Re-read run -> pid from ingest (at most every 50 ms unless forced)."""
        now = time.monotonic()
        if force or now - self._runs_checked > 0.05:
            self._runs_checked = now
            try:
                self.runs = dict(self._run_pids())
            except Exception:
                pass
        return self.runs
