"""Record decoding for probe ingest: per-run state, gaps, and numpy batch decoding.

What `Ingest` (the socket side) accepted is queued here as raw record bytes
per run; `decode_pending()` (the daemon calls it at least every 200 ms) turns
each run's bytes into columns with numpy, without a Python object per
record, and appends spans, GC events, losses and rejection counts to the
store (request events: ingest/request_events.py). Gaps in a run's sequence numbers become `losses` rows with the reason
the client's counters give. Never touches a socket and never raises on bad
record content: what it cannot store is counted in `ingest_errors`.
"""

import time
from collections import Counter

import numpy as np
import pyarrow as pa

from probe_client import wire
from stallscope.vocab.schema import STORED_NS_SQL

RECORD_DTYPE = np.dtype(
    [
        ("rtype", "u1"),
        ("flags", "u1"),
        ("kind_id", "<u2"),
        ("tid", "<u4"),
        ("start_ns", "<u8"),
        ("end_ns", "<u8"),
        ("a", "<u4"),
        ("b", "<u4"),
    ]
)
assert RECORD_DTYPE.itemsize == wire.RECORD_SIZE
_SEQLESS = np.array(wire.SEQLESS_TYPES[2], dtype=np.uint8)


class RunState:
    """What the daemon knows about one probe run while it is connected."""

    __slots__ = (
        "run_id",
        "token",
        "pid",
        "expected_seq",
        "names",
        "chunks",
        "first_seqs",
        "counts",
        "drops_full",
        "drops_disconnected",
        "drops_gc_ring",
        "drops_gc_ring_reported",
        "records",
        "last_sent_ns",
        "connected",
        "unflushed",
        "uid",
        "group_key",
        "hang_threshold_ns",
    )

    def __init__(self, run_id, token, pid, expected_seq):
        self.run_id = run_id
        self.token = token
        self.pid = pid
        self.hang_threshold_ns = 0  # the client's own hang threshold (HELLO), 0: the daemon's
        self.expected_seq = expected_seq
        self.names = [None]  # string id -> name; id 0 = none
        self.chunks = []  # raw record bytes waiting to be decoded
        self.first_seqs = []  # first sequence number of each chunk
        self.counts = []  # records in each chunk
        self.drops_full = 0
        self.drops_disconnected = 0
        self.drops_gc_ring = 0  # the client's count (v2 COUNTERS records)
        self.drops_gc_ring_reported = 0  # of those, stored as losses
        self.records = 0
        self.last_sent_ns = 0
        self.connected = True
        self.unflushed = False
        self.uid = None  # SO_PEERCRED uid (run groups: a key joins runs of one uid)
        self.group_key = None  # runs.group_key (ingest/runs.py)


class RecordDecoder:
    """The decoding half of `Ingest` (a mixin: state lives on the Ingest)."""

    def _strings(self, run, data, count):
        for i in range(count):
            off = wire.HEADER_SIZE + i * wire.RECORD_SIZE
            if data[off] != wire.REC_STRING:
                continue
            _, _, sid, _, raw = wire.STRING_RECORD.unpack_from(data, off)
            if sid == 0:
                continue
            name = raw.rstrip(b"\0").decode("utf-8", "replace")
            names = run.names
            if sid >= len(names):
                if sid > 0xFFFF:
                    continue
                names.extend([None] * (sid + 1 - len(names)))
            names[sid] = name

    def _gap(self, run, missing, sent_ns, drops_full, drops_disc):
        if drops_disc > run.drops_disconnected:
            reason = "client_disconnected"
        elif drops_full > run.drops_full:
            reason = "client_socket_full"
        else:
            reason = "sequence_gap"
        self._loss(run, missing, run.last_sent_ns or sent_ns, sent_ns, reason)

    def _loss(self, run, count, start_ns, end_ns, reason):
        # Queued as rows and appended as one batch per decode: one INSERT
        # statement per gap costs ~2.5 ms of the writer's time here, and an
        # overloaded client makes a gap per datagram.
        self.lost_records += count
        self._losses.append((run.run_id, start_ns, end_ns, count, reason))

    def has_pending(self):
        """Whether anything arrived (records, runs, closes, rejections) that
        decode_pending has not handled yet."""
        return self._changes != self._changes_decoded

    def progress_statements(self):
        """The store's flush hook: the UPDATE of `runs` progress (last_seq,
        records) of every run that moved since the last flush, not one per
        decode: a keyed UPDATE per run for one or two runs, else one joined
        UPDATE for all (~1.8 ms, whatever the number of runs)."""
        with self._progress_lock:
            progress, self._progress = self._progress, {}
        if not progress:
            return []
        ids = list(progress)
        last = [progress[i][0] for i in ids]
        recs = [progress[i][1] for i in ids]
        if len(ids) <= 2:
            # the join below costs ~1.8 ms a flush, a keyed UPDATE ~0.8 ms
            return [
                (
                    "UPDATE runs SET last_seq = ?, records = ?, "
                    f"stored_ns = {STORED_NS_SQL} WHERE run_id = ?",
                    [last[i], recs[i], ids[i]],
                )
                for i in range(len(ids))
            ]
        return [
            (
                "UPDATE runs SET last_seq = u.last_seq, records = u.records, "
                f"stored_ns = {STORED_NS_SQL} FROM (SELECT unnest(?::BIGINT[]) AS run_id, "
                "unnest(?::BIGINT[]) AS last_seq, unnest(?::BIGINT[]) AS records) u "
                "WHERE runs.run_id = u.run_id",
                [ids, last, recs],
            )
        ]

    def decode_pending(self):
        """Turn every run's queued record bytes into column batches for the store."""
        self._changes_decoded = self._changes
        upto = self._read_upto_ns  # what was read by then is decoded below
        new_runs, run_changes = self._take_run_writes()
        with self._lock:
            work = []
            for run in self.runs.values():
                if run.chunks:
                    work.append((run, run.chunks, run.first_seqs, run.counts, list(run.names)))
                    run.chunks, run.first_seqs, run.counts = [], [], []
                    run.unflushed = True
            losses, self._losses = self._losses, []
            self.undecoded = 0
        self.store.record_losses("client", losses)
        for run, chunks, first_seqs, counts, names in work:
            self._decode_run(run, chunks, first_seqs, counts, names)
        self._forget_request_runs()
        with self._lock:
            # Taken after decoding, so that what decoding rejected is written
            # now, not one decode later (or never, at shutdown).
            rejections, self._pending_rejections = self._pending_rejections, Counter()
        new_ids = self._write_runs(new_runs, run_changes)  # rows carry their counters
        updates = []
        for run in list(self.runs.values()):
            if run.unflushed:
                run.unflushed = False
                if run.run_id not in new_ids:
                    updates.append((run.run_id, run.expected_seq - 1, run.records))
        if updates:
            with self._progress_lock:
                for run_id, last_seq, records in updates:
                    self._progress[run_id] = (last_seq, records)
        if rejections:
            now = time.monotonic_ns()
            keys = list(rejections)
            self.store.append(
                "ingest_errors",
                {
                    "ts_ns": np.full(len(keys), now, dtype=np.int64),
                    "run_id": [k[0] for k in keys],
                    "pid": [k[1] for k in keys],
                    "reason": [k[2] for k in keys],
                    "count": [rejections[k] for k in keys],
                },
            )
        self.caught_up_ns = max(self.caught_up_ns, upto)  # Ingest.caught_up_ns

    def _decode_run(self, run, chunks, first_seqs, counts, names):
        recs = np.frombuffer(b"".join(chunks), dtype=RECORD_DTYPE)
        # Sequence number of each record: its datagram's first_seq plus its
        # index among that datagram's sequence-carrying (non-string) records.
        counts = np.asarray(counts, dtype=np.int64)
        rtype = recs["rtype"]
        # v1 datagrams had their types 4 and 5 rewritten at ingest: one rule.
        carries = (~np.isin(rtype, _SEQLESS)).astype(np.int64)
        running = np.cumsum(carries) - carries
        chunk_start = np.repeat(np.cumsum(counts) - counts, counts)
        seq = (
            np.repeat(np.asarray(first_seqs, dtype=np.int64), counts)
            + running
            - running[chunk_start]
        )

        name_table = np.array(names, dtype=object)

        def lookup(ids):
            ids = ids.astype(np.int64)
            known = ids < len(name_table)
            return name_table[np.where(known, ids, 0)], int((~known).sum())

        is_span = rtype == wire.REC_SPAN
        spans = recs[is_span]
        gcs = recs[rtype == wire.REC_GC]
        span_seq = seq[is_span]
        gc_seq = seq[rtype == wire.REC_GC]
        run_id = run.run_id
        work, has_work, idle, has_idle = self._span_ext(run, recs, is_span, counts, len(spans))

        if len(spans):
            ok = spans["end_ns"] >= spans["start_ns"]
            if not ok.all():
                self._reject(run_id, run.pid, "span_end_before_start", int((~ok).sum()))
                spans, span_seq = spans[ok], span_seq[ok]
                work, has_work, idle, has_idle = work[ok], has_work[ok], idle[ok], has_idle[ok]
            kinds, bad_k = lookup(spans["kind_id"])
            stages, bad_s = lookup(spans["a"])
            if bad_k or bad_s:
                self._reject(run_id, run.pid, "unknown_string_id", bad_k + bad_s)
            self._note_span_threads(run, spans["tid"])
            self.store.append(
                "spans",
                {
                    "run_id": np.full(len(spans), run_id, dtype=np.int64),
                    "tid": spans["tid"].astype(np.int64),
                    "kind": kinds,
                    "stage": stages,
                    "batch": spans["b"].astype(np.int64),
                    "start_ns": spans["start_ns"].astype(np.int64),
                    "end_ns": spans["end_ns"].astype(np.int64),
                    "depth": spans["flags"].astype(np.int16),
                    "seq": span_seq,
                    "work": pa.array(work, mask=~has_work, type=pa.int64()),
                    "idle": pa.array(idle, mask=~has_idle, type=pa.bool_()),
                },
            )
        if len(gcs):
            ok = (gcs["flags"] <= 2) & (gcs["end_ns"] >= gcs["start_ns"])
            if not ok.all():
                self._reject(run_id, run.pid, "bad_gc_record", int((~ok).sum()))
                gcs, gc_seq = gcs[ok], gc_seq[ok]
            self.store.append(
                "gc_events",
                {
                    "run_id": np.full(len(gcs), run_id, dtype=np.int64),
                    "tid": gcs["tid"].astype(np.int64),
                    "generation": gcs["flags"].astype(np.int8),
                    "start_ns": gcs["start_ns"].astype(np.int64),
                    "end_ns": gcs["end_ns"].astype(np.int64),
                    "collected": gcs["a"].astype(np.int64),
                    "uncollectable": gcs["b"].astype(np.int64),
                    "seq": gc_seq,
                },
            )
        stored = self._decode_requests(run, recs, rtype, seq)
        run.records += len(spans) + len(gcs) + stored

    def _note_span_threads(self, run, tids):
        """Tell `on_step_threads(pid, tids)` of threads new to this run's spans
        (the scheduling probe keeps exact rows for them)."""
        known = self.__dict__.setdefault("_span_tids", {}).setdefault(run.pid, set())
        new = set(np.unique(tids).tolist()) - known
        if new:
            known |= new
            hook = getattr(self, "on_step_threads", None)
            if hook is not None:
                hook(run.pid, sorted(new))

    def _span_ext(self, run, recs, is_span, counts, n_spans):
        """Work and idle of each span from the SPAN_EXT record right after it
        in the same datagram (v2); (values, present) pairs, NULL if none."""
        work = np.zeros(n_spans, dtype=np.int64)
        has_work = np.zeros(n_spans, dtype=bool)
        idle = np.zeros(n_spans, dtype=bool)
        has_idle = np.zeros(n_spans, dtype=bool)
        is_ext = recs["rtype"] == wire.REC_SPAN_EXT
        if not is_ext.any():
            return work, has_work, idle, has_idle
        after_span = np.zeros(len(recs), dtype=bool)
        after_span[1:] = is_span[:-1]
        after_span[np.cumsum(counts) - counts] = False  # a datagram's first record
        good = is_ext & after_span
        orphans = int((is_ext & ~after_span).sum())
        if orphans:
            self._reject(run.run_id, run.pid, "orphan_span_ext", orphans)
        at = np.flatnonzero(good)
        target = (np.cumsum(is_span) - 1)[at - 1]  # index of the span before each
        flags = recs["flags"][at]
        work[target] = recs["start_ns"][at].astype(np.int64)  # the i64 bits
        has_work[target] = (flags & wire.EXT_HAS_WORK) != 0
        idle[target] = (flags & wire.EXT_IDLE) != 0
        has_idle[target] = (flags & wire.EXT_HAS_IDLE) != 0
        return work, has_work, idle, has_idle
