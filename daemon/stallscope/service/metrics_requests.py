"""Prometheus histograms of request latency: TTFT and inter-token latency per run label.

Fed by `Metrics.on_batch` with each `request_events` batch the store queues
(on the producer's thread). The batch is sorted by (run, request, time) in
numpy; gaps between consecutive `token` events of a request inside the batch
are taken in one array operation, and Python work is per distinct request
of the batch (its state: arrival and last token time), never per record.
TTFT is a request's first `token` event less its `arrived` event, as
`request_latency` computes it; a request whose arrival was never seen (it
arrived in another process, or before the daemon started) has no TTFT
sample. A `finished` or `aborted` event forgets the request; at most
MAX_OPEN requests are remembered (the oldest forgotten first), so an engine
that never ends its requests costs bounded memory. Same label rule as the
step histograms: the run label, bounded.
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Upper bounds, seconds: a first token takes from a few ms (a short prompt
# on a free engine) to tens of seconds (a long queue); a token gap from
# ~1 ms to the seconds a stall or a preemption costs.
TTFT_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
MAX_OPEN = 200_000


class RequestLatency:
    """Open requests' arrival and last token, and the two histograms.

    Not locked itself: the caller (`Metrics`) holds its lock around `fold`
    and the families."""

    def __init__(self, histograms):
        self.ttft = histograms(TTFT_BUCKETS_S)  # (run_label,)
        self.itl = histograms(ITL_BUCKETS_S)
        self.open = {}  # (run_id, request_id) -> [arrival_ns or None, last token ns or None]
        self.waiting = {}  # run_id -> {histogram: [it, counts, sum_ns]} until its label is known

    def fold(self, batch, label_of):
        """Add a request_events batch; label_of(run_id) gives the bounded label
        (None: not known yet)."""
        event = batch["event"].cast(pa.string())
        keep = _np(
            pc.fill_null(
                pc.is_in(event, pa.array(["arrived", "token", "finished", "aborted"])), False
            )
        )
        if not keep.any():
            return
        run = _np(batch["run_id"])[keep].astype(np.int64)
        rid = _np(batch["request_id"])[keep].astype(np.uint64)
        ts = _np(batch["ts_ns"])[keep].astype(np.int64)
        names = np.asarray(event.to_numpy(zero_copy_only=False), dtype=object)[keep]
        order = np.lexsort((ts, rid, run))
        run, rid, ts, names = run[order], rid[order], ts[order], names[order]
        tok = names == "token"
        # token gaps inside the batch: consecutive token events of one request
        t_run, t_rid, t_ts = run[tok], rid[tok], ts[tok]
        same = (t_run[1:] == t_run[:-1]) & (t_rid[1:] == t_rid[:-1])
        gaps, gap_runs = (t_ts[1:] - t_ts[:-1])[same], t_run[1:][same]
        extra_gaps, extra_runs, ttft, ttft_runs = [], [], [], []
        # per distinct request of the batch: its first and last token, arrival, end
        starts = np.flatnonzero(np.r_[True, (run[1:] != run[:-1]) | (rid[1:] != rid[:-1])])
        bounds = np.r_[starts, len(run)]
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            key = (int(run[a]), int(rid[a]))
            state = self.open.get(key)
            seg_names, seg_ts = names[a:b], ts[a:b]
            arrived = np.flatnonzero(seg_names == "arrived")
            if state is None:
                state = [None, None]
            if len(arrived) and state[0] is None:
                state[0] = int(seg_ts[arrived[0]])
            toks = np.flatnonzero(seg_names == "token")
            if len(toks):
                first, last = int(seg_ts[toks[0]]), int(seg_ts[toks[-1]])
                if state[1] is None:
                    if state[0] is not None:
                        ttft.append(first - state[0])
                        ttft_runs.append(key[0])
                else:
                    extra_gaps.append(first - state[1])
                    extra_runs.append(key[0])
                state[1] = last
            if ((seg_names == "finished") | (seg_names == "aborted")).any():
                self.open.pop(key, None)
            else:
                self.open[key] = state
        if len(self.open) > MAX_OPEN:
            for old in list(self.open)[: len(self.open) - MAX_OPEN]:
                del self.open[old]
        self._add(self.itl, np.r_[gap_runs, np.array(extra_runs, dtype=np.int64)],
                  np.r_[gaps, np.array(extra_gaps, dtype=np.int64)], label_of)  # fmt: skip
        self._add(self.ttft, np.array(ttft_runs, dtype=np.int64), np.array(ttft, dtype=np.int64),
                  label_of)  # fmt: skip

    def _add(self, hist, runs, values_ns, label_of):
        ok = values_ns >= 0  # a negative gap or TTFT is a client's clock bug: not a sample
        runs, values_ns = runs[ok], values_ns[ok].astype(np.float64)
        if not len(runs):
            return
        keys, inverse = np.unique(runs, return_inverse=True)
        counts, sums = hist.tally(inverse.ravel(), len(keys), values_ns)
        for i, run_id in enumerate(keys.tolist()):
            label = label_of(run_id)
            if label is not None:
                hist.merge((label,), counts[i], sums[i])
                continue
            # its runs row comes later: kept per run until the label is known
            entry = self.waiting.setdefault(run_id, {}).setdefault(id(hist), [hist, 0, 0.0])
            entry[1] = entry[1] + counts[i]
            entry[2] += float(sums[i])

    def labelled(self, run_id, label):
        """The run's label is known: its waiting samples join the histograms."""
        for hist, counts, sum_ns in self.waiting.pop(run_id, {}).values():
            hist.merge((label,), counts, sum_ns)

    def families(self):
        yield self.ttft.family(
            "stallscope_request_ttft_seconds",
            "Time to first token of traced requests (first token event - arrived), by run label.",
            ["run_label"],
        )
        yield self.itl.family(
            "stallscope_request_itl_seconds",
            "Inter-token latency of traced requests (gaps between token events), by run label.",
            ["run_label"],
        )


def _np(column):
    return column.to_numpy(zero_copy_only=False)
