"""Open requests followed live from request_events batches: what the
Prometheus request histograms and the API's RequestFinished events read.

`RequestEnds.fold(batch)` takes one `request_events` batch as the store
queues it (on the producer's thread): rows sorted by (run, request, time) in
numpy, gaps between consecutive `token` events of a request inside the
batch taken in one array operation, and Python work per distinct request of
the batch (its state: arrival, first and last token, tokens, longest gap),
never per record. It returns the TTFT and inter-token samples of the batch
and the requests that ended in it (`finished` or `aborted`), each with its
latency as `request_latency` computes it (TTFT = first token - arrival;
unknown when the arrival came from another process or before the daemon
started). At most MAX_OPEN requests are remembered, the oldest forgotten
first, so an engine that never ends its requests costs bounded memory.
`learn_text` takes `requests` batches for the str ids' text. A daemon holds
one `RequestFolder`: the store listener that folds each batch once and hands
the result to every reader (the histograms, the feed), so a daemon serving
both /metrics and the API follows its requests once, not once per reader.
"""

import logging
import threading
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger(__name__)

MAX_OPEN = 100_000
_KEPT = pa.array(["arrived", "token", "finished", "aborted"])


@dataclass
class Folded:
    """One batch's samples (run ids beside values, ns) and ended requests."""

    ttft_runs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ttft_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    itl_runs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    itl_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # the token event that ended each gap: its thread and time (the step
    # that served it is that thread's step around that time)
    itl_tids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    itl_end_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ended: list = field(default_factory=list)  # dicts: RequestFinished's fields


class _Open:
    __slots__ = ("arrival", "first", "last", "tokens", "max_gap", "text")

    def __init__(self):
        self.arrival = self.first = self.last = self.max_gap = self.text = None
        self.tokens = 0


def _np(column):
    return column.to_numpy(zero_copy_only=False)


class RequestEnds:
    """Not locked: one producer thread folds at a time (the store's listener)."""

    def __init__(self, max_open=MAX_OPEN):
        self.max_open = max_open
        self.open = {}  # (run_id, request_id) -> _Open

    def learn_text(self, batch):
        """A `requests` batch: the text of str ids, for their RequestFinished."""
        if "text" not in batch.column_names:
            return
        texts = batch["text"].to_pylist()
        if not any(texts):
            return
        for run, rid, text in zip(_np(batch["run_id"]).tolist(), _np(batch["request_id"]).tolist(),
                                  texts, strict=True):  # fmt: skip
            if text is not None:  # its events may come before or after this row
                self.open.setdefault((run, rid), _Open()).text = text

    def fold(self, batch):
        out = Folded()
        event = batch["event"].cast(pa.string())
        keep = _np(pc.fill_null(pc.is_in(event, _KEPT), False))
        if not keep.any():
            return out
        run = _np(batch["run_id"])[keep].astype(np.int64)
        rid = _np(batch["request_id"])[keep].astype(np.uint64)
        ts = _np(batch["ts_ns"])[keep].astype(np.int64)
        tokens = _np(pc.fill_null(batch["tokens"], 0))[keep].astype(np.int64)
        if "tid" in batch.column_names:
            tids = _np(pc.fill_null(batch["tid"], 0))[keep].astype(np.int64)
        else:
            tids = np.zeros(len(ts), np.int64)
        names = np.asarray(_np(event), dtype=object)[keep]
        order = np.lexsort((ts, rid, run))
        run, rid, ts, names, tokens = run[order], rid[order], ts[order], names[order], tokens[order]
        tids = tids[order]
        tok = names == "token"
        # token gaps inside the batch: consecutive token events of one request
        t_run, t_rid, t_ts, t_tid = run[tok], rid[tok], ts[tok], tids[tok]
        same = (t_run[1:] == t_run[:-1]) & (t_rid[1:] == t_rid[:-1])
        gaps = (t_ts[1:] - t_ts[:-1])[same]
        gap_runs = t_run[1:][same]
        gap_tids, gap_ends = t_tid[1:][same], t_ts[1:][same]
        # the longest in-batch gap of each request, per token position
        gap_owner = np.flatnonzero(tok)[1:][same]  # the row that ends each gap
        extra_gaps, extra_runs, ttft, ttft_runs = [], [], [], []
        extra_tids, extra_ends = [], []
        starts = np.flatnonzero(np.r_[True, (run[1:] != run[:-1]) | (rid[1:] != rid[:-1])])
        bounds = np.r_[starts, len(run)].tolist()
        gap_at = np.searchsorted(gap_owner, bounds) if len(gap_owner) else None
        for i in range(len(bounds) - 1):
            a, b = bounds[i], bounds[i + 1]
            key = (int(run[a]), int(rid[a]))
            st = self.open.get(key) or _Open()
            seg_names = names[a:b]
            arrived = np.flatnonzero(seg_names == "arrived")
            if len(arrived) and st.arrival is None:
                st.arrival = int(ts[a + arrived[0]])
            toks = np.flatnonzero(seg_names == "token")
            if len(toks):
                first, last = int(ts[a + toks[0]]), int(ts[a + toks[-1]])
                if st.last is None:
                    st.first = first
                    if st.arrival is not None:
                        ttft.append(first - st.arrival)
                        ttft_runs.append(key[0])
                else:
                    extra_gaps.append(first - st.last)
                    extra_runs.append(key[0])
                    extra_tids.append(int(tids[a + toks[0]]))
                    extra_ends.append(first)
                    st.max_gap = max(st.max_gap or 0, first - st.last)
                if gap_at is not None and gap_at[i + 1] > gap_at[i]:
                    st.max_gap = max(st.max_gap or 0, int(gaps[gap_at[i] : gap_at[i + 1]].max()))
                st.last = last
                st.tokens += int(tokens[a:b][toks].sum())
            ends = np.flatnonzero((seg_names == "finished") | (seg_names == "aborted"))
            if len(ends):
                self.open.pop(key, None)
                end_ns = int(ts[a + ends[0]])
                out.ended.append({
                    "run_id": key[0], "request_id": key[1], "text": st.text or "",
                    "end_event": seg_names[ends[0]], "end_ns": end_ns,
                    "arrival_ns": st.arrival or 0,
                    "ttft_ns": -1 if st.arrival is None or st.first is None else st.first - st.arrival,
                    "e2e_ns": -1 if st.arrival is None else end_ns - st.arrival,
                    "output_tokens": st.tokens,
                    "itl_max_ns": -1 if st.max_gap is None else st.max_gap,
                })  # fmt: skip
            else:
                self.open[key] = st
        if len(self.open) > self.max_open:
            for old in list(self.open)[: len(self.open) - self.max_open]:
                del self.open[old]
        out.itl_runs = np.r_[gap_runs, np.array(extra_runs, dtype=np.int64)]
        out.itl_ns = np.r_[gaps, np.array(extra_gaps, dtype=np.int64)]
        out.itl_tids = np.r_[gap_tids, np.array(extra_tids, dtype=np.int64)]
        out.itl_end_ns = np.r_[gap_ends, np.array(extra_ends, dtype=np.int64)]
        out.ttft_runs = np.array(ttft_runs, dtype=np.int64)
        out.ttft_ns = np.array(ttft, dtype=np.int64)
        return out


def ended_table(ended):
    """The ended requests of a fold as one `request_finished` batch."""
    cols = {k: [e[k] for e in ended] for k in ended[0]}
    cols["request_id"] = pa.array(cols["request_id"], pa.uint64())
    cols["ts_ns"] = cols["end_ns"]  # a point event, at its end (the fanout's time range)
    return pa.table(cols)


class RequestFolder:
    """A store listener holding one RequestEnds: each `requests` batch is
    learnt and each `request_events` batch folded once, on the producer's
    thread, and the `Folded` handed to every subscriber in turn (a callable;
    it must not block). With no subscriber nothing is folded. A subscriber
    that raises is logged and the others still get the batch."""

    def __init__(self, max_open=MAX_OPEN):
        self.ends = RequestEnds(max_open)
        self._subscribers = []
        self._lock = threading.Lock()  # subscribe/unsubscribe against on_batch

    def subscribe(self, fn):
        with self._lock:
            self._subscribers = [*self._subscribers, fn]

    def unsubscribe(self, fn):
        with self._lock:
            self._subscribers = [f for f in self._subscribers if f != fn]

    @property
    def subscribers(self):
        return len(self._subscribers)

    def on_batch(self, table, batch):
        subscribers = self._subscribers  # replaced, never changed in place
        if not subscribers:
            return
        if table == "requests":
            self.ends.learn_text(batch)
        elif table == "request_events" and batch.num_rows:
            folded = self.ends.fold(batch)
            for fn in subscribers:
                try:
                    fn(folded)
                except Exception:
                    log.exception("a reader of request ends failed on a batch; continuing")


class RequestFinishedFeed:
    """Each request that ends becomes a `request_finished` batch for the
    fanout (event kind REQUEST_FINISHED, the proto's RequestFinished). Fed
    by `folder` (the daemon's RequestFolder) when given; else by its own,
    through `on_batch` as a store listener."""

    def __init__(self, fanout, folder=None):
        self.fanout = fanout
        self.own = folder is None
        self.folder = RequestFolder() if folder is None else folder
        self.folder.subscribe(self.on_folded)

    def on_batch(self, table, batch):
        if self.own:
            self.folder.on_batch(table, batch)

    def on_folded(self, folded):
        if folded.ended:
            self.fanout.on_batch("request_finished", ended_table(folded.ended))

    def close(self):
        self.folder.unsubscribe(self.on_folded)
