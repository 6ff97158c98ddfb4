"""Prometheus histograms of request latency: TTFT and inter-token latency per run label.

Fed by `Metrics.on_batch` with each `request_events` batch the store queues
(on the producer's thread), through a RequestEnds (service/request_ends.py:
numpy per batch, Python per distinct request, bounded state). TTFT is a
request's first `token` event less its `arrived` event, as `request_latency`
computes it; a request whose arrival was never seen (it arrived in another
process, or before the daemon started) has no TTFT sample. Same label rule
as the step histograms: the run label, bounded; samples of a run whose
label is not known yet wait for it.
"""

import numpy as np

from stallscope.service.request_ends import RequestEnds

# Upper bounds, seconds: a first token takes from a few ms (a short prompt
# on a free engine) to tens of seconds (a long queue); a token gap from
# ~1 ms to the seconds a stall or a preemption costs.
TTFT_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip


class RequestLatency:
    """The two histograms, fed by a RequestEnds (service/request_ends.py).

    Not locked itself: the caller (`Metrics`) holds its lock around `fold`
    and the families."""

    def __init__(self, histograms):
        self.ttft = histograms(TTFT_BUCKETS_S)  # (run_label,)
        self.itl = histograms(ITL_BUCKETS_S)
        self.ends = RequestEnds()
        self.waiting = {}  # run_id -> {histogram: [it, counts, sum_ns]} until its label is known

    @property
    def open(self):
        return self.ends.open

    def fold(self, batch, label_of):
        """Add a request_events batch; label_of(run_id) gives the bounded label
        (None: not known yet)."""
        f = self.ends.fold(batch)
        self._add(self.itl, f.itl_runs, f.itl_ns, label_of)
        self._add(self.ttft, f.ttft_runs, f.ttft_ns, label_of)

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
