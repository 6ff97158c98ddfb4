"""Prometheus metrics: what the store receives, summed per batch, served at /metrics.

`Metrics.on_batch` is a store listener (it sees every batch the store queues,
on the producer's thread): it folds a whole batch into a few numpy bucket
counts and sums under one short lock, never a Python step per record, so a
scrape costs ingest nothing and a busy ingest costs a scrape nothing. The
rest (records stored, lost and rejected, probe states, the daemon's CPU and
memory) is read when Prometheus scrapes (`metrics_scrape.py`). Slow steps
by cause are the API's live stall detector's alerts (store/alerts.py), handed
to `fold_alerts`. Request TTFT and inter-token latency come from
`request_events` batches, folded once by the daemon's RequestFolder
(store/request_ends.py). Labels are bounded: run label and stage keep their first
`max_label_values` values each and fold the rest into "other"; no pid, tid
or run id label exists. docs/metrics.md lists every metric. It never
writes to the database and never blocks a producer on a scrape.
"""

import logging
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.core import (
    CounterMetricFamily,
    HistogramMetricFamily,
)

from stallscope.service import metrics_scrape as scrape
from stallscope.service.metrics_scrape import GPU_FIELDS, counter
from stallscope.store.request_ends import RequestFolder
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

# Upper bounds, seconds (Prometheus `le`): engine steps run from ~100 us
# (tiny models) to seconds (long prefills); the seed's stalls sat at 3-100 ms.
STEP_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
# GC passes: young collections take microseconds, the seed's gen-2 ~100 ms.
GC_BUCKETS_S = (
    0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0,
)  # fmt: skip
# Upper bounds, seconds: a first token takes from a few ms (a short prompt
# on a free engine) to tens of seconds (a long queue); a token gap from
# ~1 ms to the seconds a stall or a preemption costs.
TTFT_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
OTHER = "other"  # the label value beyond max_label_values
DEFAULT_MAX_LABEL_VALUES = 32
# run_id -> label entries kept; past this the oldest are forgotten (and
# looked up again in the database if their run sends more steps).
MAX_KNOWN_RUNS = 10_000


class _Histograms:
    """Bucket counts and sums per label tuple, filled a batch at a time."""

    def __init__(self, bounds_s):
        self.bounds_s = bounds_s
        self.bounds_ns = np.array([b * 1e9 for b in bounds_s])
        self.by_key = {}  # labels tuple -> [counts (len(bounds)+1 int64), sum_ns]

    def tally(self, inverse, n_keys, durations_ns):
        """(bucket counts [n_keys, buckets], sums ns [n_keys]) of rows whose
        key index is `inverse`."""
        nb = len(self.bounds_ns) + 1
        # v <= bound lands in that bound's bucket (Prometheus `le`).
        bucket = np.searchsorted(self.bounds_ns, durations_ns, side="left")
        counts = np.bincount(inverse * nb + bucket, minlength=n_keys * nb).reshape(-1, nb)
        return counts, np.bincount(inverse, weights=durations_ns, minlength=n_keys)

    def merge(self, key, counts, sum_ns):
        entry = self.by_key.get(key)
        if entry is None:
            entry = self.by_key[key] = [np.zeros(len(self.bounds_ns) + 1, dtype=np.int64), 0.0]
        entry[0] += counts
        entry[1] += float(sum_ns)

    def add(self, keys, inverse, durations_ns):
        """keys: the distinct label tuples; inverse: each row's index in keys."""
        counts, sums = self.tally(inverse, len(keys), durations_ns)
        for i, key in enumerate(keys):
            self.merge(key, counts[i], sums[i])

    def family(self, name, doc, label_names):
        fam = HistogramMetricFamily(name, doc, labels=label_names)
        for key, (counts, sum_ns) in sorted(self.by_key.items()):
            running = np.cumsum(counts)
            buckets = [(_le(b), float(c)) for b, c in zip(self.bounds_s, running, strict=False)]
            buckets.append(("+Inf", float(running[-1])))
            fam.add_metric(list(key), buckets, sum_ns / 1e9)
        return fam


class RequestLatency:
    """The two histograms, fed by a RequestFolder's `Folded` batches
    (store/request_ends.py).

    Not locked itself: the caller (`Metrics`) holds its lock around `add`
    and the families."""

    def __init__(self, histograms, folder):
        self.ttft = histograms(TTFT_BUCKETS_S)  # (run_label,)
        self.itl = histograms(ITL_BUCKETS_S)
        self.folder = folder
        self.waiting = {}  # run_id -> {histogram: [it, counts, sum_ns]} until its label is known

    @property
    def open(self):
        return self.folder.ends.open

    def add(self, f, label_of):
        """Add one folded request_events batch; label_of(run_id) gives the
        bounded label (None: not known yet)."""
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


# A token gap waits this long (the client's and the daemon's CLOCK_MONOTONIC)
# for the stall alert of the step that ended it before it is counted as
# served by a step that was not slow: alerts come from the API's detector,
# which holds an unexplained one 0.25 s and keeps events 5 s (store/alerts.py).
ITL_CAUSE_HOLD_NS = 5_000_000_000
ITL_CAUSE_MAX_WAITING = 1_000_000  # gaps waiting; past it the oldest are counted at once
NOT_SLOW = "not_slow"


class ItlByCause:
    """Inter-token gaps by the cause of the step that served the token ending
    each gap: the stall alert's cause when that step (same run and thread,
    the token's time inside the step) was slow, `not_slow` when no alert
    came within ITL_CAUSE_HOLD_NS. The label is the cause vocabulary (a
    score of values at most). Not locked itself (Metrics holds its lock)."""

    def __init__(self, histograms, now_ns=time.monotonic_ns):
        self.hist = histograms(ITL_BUCKETS_S)  # (cause,)
        self.now_ns = now_ns
        self.waiting = []  # [(runs, tids, end_ns, gap_ns)] arrays, oldest first
        self.n_waiting = 0
        self.oldest_ns = None  # the earliest waiting gap's end: count() is a no-op before it is due
        self.slow = {}  # (run_id, tid) -> [(start_ns, end_ns, cause)] of alerts

    def add_gaps(self, f):
        ok = f.itl_ns >= 0
        if not ok.any():
            return
        self.waiting.append((f.itl_runs[ok], f.itl_tids[ok], f.itl_end_ns[ok], f.itl_ns[ok]))
        self.n_waiting += int(ok.sum())
        first = int(f.itl_end_ns[ok].min())
        self.oldest_ns = first if self.oldest_ns is None else min(self.oldest_ns, first)
        if self.n_waiting > ITL_CAUSE_MAX_WAITING:
            self.count(force=True)

    def add_alerts(self, batch):
        cols = [_np(batch[c]).tolist() for c in ("run_id", "tid", "start_ns", "end_ns")]
        causes = pc.fill_null(batch["cause"], "unexplained").to_pylist()
        for run_id, tid, start, end, cause in zip(*cols, causes, strict=True):
            self.slow.setdefault((run_id, tid), []).append((start, end, cause))

    def count(self, force=False):
        """Count the gaps whose wait is over (all of them with `force`)."""
        if not self.waiting:
            return
        cut = self.now_ns() - ITL_CAUSE_HOLD_NS
        if not force and self.oldest_ns > cut:  # nothing due: no concatenation per batch
            return
        runs, tids, ends, gaps = (np.concatenate(c) for c in zip(*self.waiting, strict=True))
        ready = np.ones(len(ends), bool) if force else ends <= cut
        rest = ~ready
        self.waiting = [(runs[rest], tids[rest], ends[rest], gaps[rest])] if rest.any() else []
        self.n_waiting = int(rest.sum())
        self.oldest_ns = int(ends[rest].min()) if rest.any() else None
        if not ready.any():
            return
        runs, tids, ends, gaps = runs[ready], tids[ready], ends[ready], gaps[ready]
        causes = np.full(len(ends), NOT_SLOW, dtype=object)
        keys = runs * (1 << 32) + tids  # tids are u32
        for key in np.unique(keys).tolist():
            steps = self.slow.get((key >> 32, key & 0xFFFFFFFF))
            if not steps:
                continue
            steps.sort()
            starts = np.array([st[0] for st in steps], np.int64)
            stops = np.array([st[1] for st in steps], np.int64)
            rows = np.flatnonzero(keys == key)
            i = np.searchsorted(starts, ends[rows], side="right") - 1
            hit = (i >= 0) & (ends[rows] <= stops[np.maximum(i, 0)])
            names = [steps[j][2] for j in i[hit].tolist()]
            causes[rows[hit]] = names
        labels, inverse = np.unique(causes.astype(str), return_inverse=True)
        self.hist.add([(c,) for c in labels.tolist()], inverse.ravel(), gaps.astype(np.float64))
        # alerts of steps every waiting gap is past are of no more use
        oldest = int(self.waiting[0][2].min()) if self.waiting else cut
        for key in list(self.slow):
            kept = [st for st in self.slow[key] if st[1] >= oldest - ITL_CAUSE_HOLD_NS]
            if kept:
                self.slow[key] = kept
            else:
                del self.slow[key]

    def family(self):
        return self.hist.family(
            "stallscope_request_itl_by_cause_seconds",
            "Inter-token latency of traced requests by the cause of the step that served "
            "the token ending the gap (its stall alert's; not_slow when it was not slow). "
            "Counted 5 s after the token; needs the API (its stall detector).",
            ["cause"],
        )


def _le(bound_s):
    return repr(float(bound_s))


class _Bounded:
    """A label's values: the first `limit` distinct ones are kept, the rest are OTHER."""

    def __init__(self, limit):
        self.limit = limit
        self.seen = set()
        self.folded = 0  # distinct values folded into OTHER

    def __call__(self, value):
        value = value or ""
        if value in self.seen:
            return value
        if len(self.seen) < self.limit:
            self.seen.add(value)
            return value
        self.folded += 1
        return OTHER


def _np(column):
    return column.to_numpy(zero_copy_only=False)


class Metrics:
    """The daemon's metrics: a store listener plus a Prometheus collector."""

    def __init__(self, daemon, max_label_values=DEFAULT_MAX_LABEL_VALUES, folder=None):
        """`folder`: the daemon's RequestFolder (it then folds the request
        batches, shared with the API's feed); without one, Metrics folds its
        own from the batches `on_batch` sees."""
        self.daemon = daemon
        self._lock = threading.Lock()
        self._run_label = _Bounded(max_label_values)
        self._stage = _Bounded(max_label_values)
        self._labels = {}  # run_id -> bounded label value
        self._steps = _Histograms(STEP_BUCKETS_S)  # (run_label, stage)
        self._unlabelled = {}  # run_id -> {stage: [counts, sum_ns]} until its label is known
        self._gc = _Histograms(GC_BUCKETS_S)  # (generation,)
        self._own_folder = folder is None
        self._requests = RequestLatency(  # TTFT and ITL by run label
            _Histograms, RequestFolder() if folder is None else folder
        )
        self._requests.folder.subscribe(self._add_requests)
        # ITL by the serving step's cause: only while stall alerts come in
        # (the API's detector; `follow_alerts`), else nothing is kept
        self._itl_by_cause = None
        self._gc_collected = {}  # generation -> objects
        self._offcpu_s = {"preempted": 0.0, "blocked": 0.0}
        self._offcpu_intervals = {"preempted": 0, "blocked": 0}
        self._slow = {}  # cause -> steps
        self._gpu = {}  # gpu -> {column: last value}
        self.batches_seen = 0

    # ----- producers (store listener; the producer's thread) -----------------------
    def on_batch(self, table, batch):
        try:
            fold = _FOLDERS.get(table)
            if fold is not None and batch.num_rows:
                fold(self, batch)
        except Exception:
            log.exception("metrics: could not fold a %s batch; continuing", table)

    def _fold_runs(self, batch):
        ids = _np(batch["run_id"]).tolist()
        labels = batch["label"].to_pylist()
        with self._lock:
            for run_id, label in zip(ids, labels, strict=True):
                self._learn_label(run_id, label)

    def _learn_label(self, run_id, label):
        """Under the lock: remember run_id's label and move its waiting steps."""
        if len(self._labels) >= MAX_KNOWN_RUNS:
            for old in list(self._labels)[: MAX_KNOWN_RUNS // 10]:
                del self._labels[old]
        bounded = self._labels[run_id] = self._run_label(label)
        for stage, (counts, sum_ns) in self._unlabelled.pop(run_id, {}).items():
            self._steps.merge((bounded, self._stage(stage)), counts, sum_ns)
        self._requests.labelled(run_id, bounded)

    def _fold_spans(self, batch):
        # All in Arrow and numpy: no Python object per row (a string column
        # turned into Python strings halved the ingest rate). cast: a batch
        # whose names are all unknown has a column of type null.
        is_step = _np(pc.fill_null(pc.equal(batch["kind"].cast(pa.string()), "step"), False))
        if not is_step.any():
            return
        every = bool(is_step.all())  # then no copy at all

        def steps(name):
            column = batch[name]
            return column if every else column.filter(pa.array(is_step))

        durations = (_np(steps("end_ns")) - _np(steps("start_ns"))).astype(np.float64)
        encoded = pc.dictionary_encode(
            pc.fill_null(steps("stage").cast(pa.string()), "")
        ).combine_chunks()
        stage_names = encoded.dictionary.to_pylist()  # the few distinct stages
        stage_idx = _np(encoded.indices).astype(np.int64)
        run_ids = _np(steps("run_id"))
        if run_ids[0] == run_ids.min() == run_ids.max():  # ingest appends one run a batch
            runs, run_idx = run_ids[:1], np.zeros(len(run_ids), dtype=np.int64)
        else:
            runs, run_idx = np.unique(run_ids, return_inverse=True)
        n_stages = len(stage_names)
        counts, sums = self._steps.tally(
            run_idx.ravel() * n_stages + stage_idx, len(runs) * n_stages, durations
        )
        with self._lock:
            for i, run_id in enumerate(runs.tolist()):
                label = self._labels.get(run_id)
                for j, stage in enumerate(stage_names):
                    k = i * n_stages + j
                    if not counts[k].any():
                        continue
                    if label is not None:
                        self._steps.merge((label, self._stage(stage)), counts[k], sums[k])
                        continue
                    # Its runs row comes later: kept per run until the label is known.
                    waiting = self._unlabelled.setdefault(run_id, {})
                    entry = waiting.setdefault(stage, [0, 0.0])
                    entry[0] = entry[0] + counts[k]
                    entry[1] += float(sums[k])

    def _fold_request_events(self, batch):
        if self._own_folder:  # else the daemon's folder has it, once for every reader
            self._requests.folder.on_batch("request_events", batch)

    def _fold_requests(self, batch):
        if self._own_folder:
            self._requests.folder.on_batch("requests", batch)

    def _add_requests(self, folded):
        with self._lock:
            self._requests.add(folded, self._labels.get)
            if self._itl_by_cause is not None and len(folded.itl_ns):
                self._itl_by_cause.add_gaps(folded)
                self._itl_by_cause.count()

    def follow_alerts(self, now_ns=time.monotonic_ns):
        """Stall alerts will come (fold_alerts): count ITL by step cause too."""
        with self._lock:
            if self._itl_by_cause is None:
                self._itl_by_cause = ItlByCause(_Histograms, now_ns)

    def close(self):
        """Stop reading the folder (it may outlive this Metrics)."""
        self._requests.folder.unsubscribe(self._add_requests)

    def _fold_gc(self, batch):
        gens = _np(batch["generation"]).astype(np.int64)
        durations = (_np(batch["end_ns"]) - _np(batch["start_ns"])).astype(np.float64)
        collected = _np(pc.fill_null(batch["collected"], 0)).astype(np.int64)
        names, inverse = np.unique(gens, return_inverse=True)
        per_gen = np.bincount(inverse, weights=collected, minlength=len(names))
        with self._lock:
            self._gc.add([(str(g),) for g in names.tolist()], inverse.ravel(), durations)
            for g, n in zip(names.tolist(), per_gen.tolist(), strict=True):
                self._gc_collected[g] = self._gc_collected.get(g, 0) + int(n)

    def _fold_offcpu(self, batch):
        from stallscope.vocab.offcpu import offcpu_weights  # the alerts' pro-rating rule

        weights = offcpu_weights(batch)
        length_s = (_np(batch["end_ns"]) - _np(batch["start_ns"])).astype(np.float64) / 1e9
        off_s = float((length_s * weights[:, 0]).sum())
        pre_s = float((length_s * weights[:, 1]).sum())
        preempted = int((weights[:, 1] >= 0.5).sum())
        with self._lock:
            self._offcpu_s["preempted"] += pre_s
            self._offcpu_s["blocked"] += off_s - pre_s
            self._offcpu_intervals["preempted"] += preempted
            self._offcpu_intervals["blocked"] += batch.num_rows - preempted

    def _fold_gpu(self, batch):
        gpus = _np(batch["gpu"])
        latest = {}
        for column, *_ in GPU_FIELDS:
            if column not in batch.column_names:
                continue
            values = batch[column].cast(pa.int64())  # a column of nulls has type null
            valid = _np(pc.invert(pc.is_null(values)))
            numbers = _np(pc.fill_null(values, 0))
            for gpu in np.unique(gpus).tolist():
                rows = np.flatnonzero((gpus == gpu) & valid)
                if len(rows):
                    latest.setdefault(gpu, {})[column] = int(numbers[rows[-1]])
        with self._lock:
            for gpu, values in latest.items():
                self._gpu.setdefault(gpu, {}).update(values)

    def fold_alerts(self, batch):
        """Stall alerts (store/alerts.py): one slow step each, with its cause."""
        counts = pc.value_counts(pc.fill_null(batch["cause"], "unexplained")).to_pylist()
        with self._lock:
            if self._itl_by_cause is not None and batch.num_rows:
                self._itl_by_cause.add_alerts(batch)
            for item in counts:
                cause = item["values"]
                self._slow[cause] = self._slow.get(cause, 0) + int(item["counts"])

    # ----- scrape (the HTTP server's thread) ---------------------------------------
    def describe(self):
        return []  # no fixed set: families appear as their data does

    def collect(self):
        self._label_waiting_runs()
        with self._lock:
            yield self._steps.family(
                "stallscope_step_duration_seconds",
                "Engine step durations (spans of kind 'step'), by run label and stage.",
                ["run_label", "stage"],
            )
            yield self._gc.family(
                "stallscope_gc_pause_seconds",
                "Garbage-collection pause durations of traced runs, by generation.",
                ["generation"],
            )
            yield from self._requests.families()
            if self._itl_by_cause is not None:
                self._itl_by_cause.count()
                yield self._itl_by_cause.family()
            passes = CounterMetricFamily(
                "stallscope_gc_passes",
                "Garbage-collection passes of traced runs, by generation.",
                labels=["generation"],
            )
            for (gen,), (counts, _) in sorted(self._gc.by_key.items()):
                passes.add_metric([gen], float(counts.sum()))
            yield passes
            yield counter(
                "stallscope_gc_collected_objects",
                "Objects collected by those passes, by generation.",
                "generation",
                {str(g): n for g, n in self._gc_collected.items()},
            )
            yield counter(
                "stallscope_slow_steps",
                "Steps slower than SLOW_FACTOR x their running baseline, by live cause.",
                "cause",
                self._slow,
            )
            yield counter(
                "stallscope_offcpu_seconds",
                "Time traced threads spent off CPU, by kind (preempted or blocked).",
                "kind",
                self._offcpu_s,
            )
            yield counter(
                "stallscope_offcpu_intervals",
                "Off-CPU intervals of traced threads, by kind.",
                "kind",
                self._offcpu_intervals,
            )
            folded = {"run_label": self._run_label.folded, "stage": self._stage.folded}
            gpu = {g: dict(v) for g, v in self._gpu.items()}
        yield counter(
            "stallscope_metrics_label_values_folded",
            f"Label values folded into '{OTHER}' (past metrics.max_label_values).",
            "label",
            folded,
        )
        yield from scrape.gpu_families(gpu)
        with self._lock:
            labels = dict(self._labels)
        yield from scrape.hang_families(self.daemon, labels)
        yield from scrape.daemon_families(self.daemon)

    def _label_waiting_runs(self):
        """Runs whose steps arrived before their `runs` row (ingest appends a
        new run after its first spans; a resumed run has no new row): their
        labels from the database, "" for a run it does not know."""
        with self._lock:
            waiting = list(set(self._unlabelled) | set(self._requests.waiting))
        if not waiting:
            return
        found = {}
        try:
            cur = self.daemon.store.cursor()
            try:
                found = dict(
                    cur.execute(
                        "SELECT run_id, label FROM runs WHERE run_id IN (SELECT unnest(?::BIGINT[]))",
                        [waiting],
                    ).fetchall()
                )
            finally:
                cur.close()
        except Exception as exc:
            log.debug("metrics: run labels unavailable: %s", exc)
        with self._lock:
            for run_id in waiting:
                held = run_id in self._unlabelled or run_id in self._requests.waiting
                if held and (run_id in found or self._committed(run_id)):
                    self._learn_label(run_id, found.get(run_id))

    def _committed(self, run_id):
        """True when the run's row would be in the database by now if it existed:
        nothing is waiting to be written."""
        return self.daemon.store.pending_rows == 0 and run_id not in self.daemon.ingest.runs


_FOLDERS = {
    "runs": Metrics._fold_runs,
    "spans": Metrics._fold_spans,
    "gc_events": Metrics._fold_gc,
    "request_events": Metrics._fold_request_events,
    "requests": Metrics._fold_requests,
    "offcpu": Metrics._fold_offcpu,
    "nvml_samples": Metrics._fold_gpu,
}
