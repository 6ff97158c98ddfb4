"""Live stall alerts: a step slower than its running baseline, sent at once.

The step rules of `stallscope.vocab.rules` (the ones step_attribution
uses), applied as steps arrive: a step (span kind "step") is slow when its
duration exceeds SLOW_FACTOR (1.2) times the median of the last `window`
steps with the same run, stage and batch size (at least BASELINE_MIN_STEPS
of them) and by at least MIN_EXCESS_NS in absolute terms (a 650 ns step
that took 800 ns is 1.2x slower and nothing anyone can act on); idle steps
(batch 0 on a thread that reports batches, or marked idle) are never slow
and stay out of the medians. The alert carries what is
known at that moment: GC time inside the step (passes of the same run
already received) and off-CPU time of the step's thread (the scheduling
probe's intervals already received), and a cause from the same vocabulary
and the same rule as the view (the largest disjoint component, GC first,
then run-queue wait after a sched_yield(), preempted and blocked time less
what GC overlaps, if it holds at least CAUSE_MIN_SHARE of the excess). The finer causes (lock, peer, runqueue,
irq, ...) need the kernel-cause tables: step_attribution gives them later.
An alert that nothing explains yet waits up to HOLD_UNEXPLAINED_S for late
kernel events. It reads from its own bounded subscriber queue on its own
thread, so it never slows ingest; if it falls behind it loses batches like
any subscriber (counted in `dropped`). It never queries the database.
"""

import bisect
import logging
import threading
import time
from collections import deque

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stallscope import threads
from stallscope.store.fanout import Filter
from stallscope.vocab import event_kinds, rules
from stallscope.vocab.log_channels import log_channel
from stallscope.vocab.offcpu import offcpu_weights

log = logging.getLogger(log_channel(__name__))

ALERT_COLUMNS = (
    "run_id",
    "pid",
    "tid",
    "stage",
    "batch",
    "start_ns",
    "end_ns",
    "duration_ns",
    "baseline_ns",
    "ratio",
    "gc_overlap_ns",
    "gc_generation",
    "offcpu_ns",
    "preempted_ns",
    "cause",
    "offcpu_sampled",
)
# GC passes and off-CPU intervals are kept this long for overlap (ns): a step
# and the events inside it arrive within one or two decode rounds.
HORIZON_NS = 5_000_000_000
# After a wake-up, wait this long before draining: ingest appends a run's
# spans and then its GC passes from the same decode round, microseconds apart.
SETTLE_S = 0.002
# A slow step that nothing received so far explains is held this long for
# kernel events to catch up (the scheduling probe's reader and ingest decode
# on their own cadences, so a step's off-CPU interval can arrive one round
# after the step); it is sent as soon as something explains it, or as
# 'unexplained' when the time is up.
HOLD_UNEXPLAINED_S = 0.25
# A slow step is alerted only when its excess over the baseline is at least
# this long (ns): below it the 1.2x rule fires on sub-microsecond spans
# (59,729 alerts for 200k steps of ~650 ns, mostly clock and cache noise).
# 100 us is below what a serving step's stalls are made of (a gen-2 GC pass,
# a preemption on a busy host: milliseconds) and above timer and cache noise.
MIN_EXCESS_NS = 100_000


class _Intervals:
    """Recent intervals per key as numpy arrays, pruned by age (`extra`: one
    value or a row of values per interval)."""

    def __init__(self):
        self.by_key = {}  # key -> (start_ns, end_ns, extra) arrays

    def add(self, keys, start, end, extra):
        for key in np.unique(keys):
            sel = keys == key
            k = int(key)
            new = (start[sel], end[sel], extra[sel])
            old = self.by_key.get(k)
            if old is not None:
                new = tuple(np.concatenate([o, n]) for o, n in zip(old, new, strict=True))
            self.by_key[k] = new

    def prune(self, now_ns):
        for k, (s, e, x) in list(self.by_key.items()):
            keep = e >= now_ns - HORIZON_NS
            if not keep.any():
                del self.by_key[k]
            elif not keep.all():
                self.by_key[k] = (s[keep], e[keep], x[keep])

    def overlap(self, key, start_ns, end_ns):
        """(overlap ns per interval, extras) of intervals intersecting [start, end)."""
        a, b, x = self.clip(key, start_ns, end_ns)
        if a is None:
            return None, None
        return b - a, x

    def clip(self, key, start_ns, end_ns):
        """(starts, ends, extras) of the intervals intersecting [start, end), clipped to it."""
        got = self.by_key.get(key)
        if got is None:
            return None, None, None
        s, e, x = got
        a, b = np.maximum(s, start_ns), np.minimum(e, end_ns)
        hit = b > a
        return a[hit], b[hit], x[hit]


class Baselines:
    """Running median of the last `window` step durations per (run, stage, batch)."""

    def __init__(self, window=64):
        self.window = window
        self.recent = {}  # key -> (deque of durations in order, sorted list)

    def observe(self, key, duration_ns):
        """The median before this step (None when no history), then record it."""
        entry = self.recent.get(key)
        if entry is None:
            entry = self.recent[key] = (deque(), [])
        order, ranked = entry
        n = len(ranked)
        median = ranked[n // 2] if n else None
        order.append(duration_ns)
        bisect.insort(ranked, duration_ns)
        if len(order) > self.window:
            old = order.popleft()
            del ranked[bisect.bisect_left(ranked, old)]
        return median, n


def alert_parts(gc_a, gc_b, off_a, off_b, weights):
    """Disjoint parts of a step, ns: {'gc', 'runqueue', 'preemption',
    'blocked'} from its clipped GC intervals and off-CPU intervals (weights:
    vocab.offcpu.offcpu_weights); off-CPU time under a GC pass is GC's. A
    yield (the thread gave its CPU away) is run-queue wait, not preemption,
    as in step_attribution."""
    gc_ns = float((gc_b - gc_a).sum()) if gc_a is not None else 0.0
    if off_a is None or not len(off_a):
        return {"gc": gc_ns, "runqueue": 0.0, "preemption": 0.0, "blocked": 0.0}
    length = (off_b - off_a).astype(float)
    if gc_a is not None and len(gc_a):
        under_gc = np.clip(
            np.minimum(off_b[:, None], gc_b[None, :]) - np.maximum(off_a[:, None], gc_a[None, :]),
            0,
            None,
        ).sum(axis=1)
        length = length - under_gc
    off = float((length * weights[:, 0]).sum())
    pre = float((length * weights[:, 1]).sum())
    yielded = float((length * weights[:, 3]).sum())
    return {"gc": gc_ns, "runqueue": yielded, "preemption": pre - yielded, "blocked": off - pre}


class StallDetector:
    """Consumes spans, GC passes and off-CPU intervals; publishes stall alerts."""

    def __init__(
        self,
        fanout,
        factor=rules.SLOW_FACTOR,
        window=64,
        min_samples=rules.BASELINE_MIN_STEPS,
        max_queue_events=500_000,
        hold_unexplained_s=HOLD_UNEXPLAINED_S,
        min_excess_ns=MIN_EXCESS_NS,
    ):
        self.fanout = fanout
        self.min_excess_ns = min_excess_ns
        self.hold_unexplained_s = hold_unexplained_s
        self.factor = factor
        self.min_samples = min_samples
        self.baselines = Baselines(window)
        self.gc = _Intervals()  # by run_id; extra = generation
        # by tid; extra = (fraction of the interval off CPU, fraction preempted,
        # sampled?): exact rows are (1, 1 or 0, 0); a /proc window row is
        # pro-rated by its counters.
        self.offcpu = _Intervals()
        self.sub = fanout.subscribe(
            Filter(kinds=(event_kinds.SPAN, event_kinds.GC_PASS, event_kinds.OFF_CPU)),
            max_queue_events,
            name="stall-detector",
        )
        self.alerts_sent = 0
        self.steps_seen = 0
        self.idle_steps = 0
        self.small_excess = 0  # slow by the ratio, excess below min_excess_ns
        self.reports_batch = set()  # (run_id, tid) of threads that sent a batch size > 0
        self.pending = []  # (deadline, alert args) of unexplained alerts
        self._thread = threading.Thread(target=self._run, name="stall-alerts", daemon=True)

    @property
    def dropped(self):
        return self.sub.dropped_total

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self.fanout.unsubscribe(self.sub)
        self._thread.join(timeout=2)

    def _run(self):
        threads.background("alerts")
        while not self.sub.closed:
            items, _ = self.sub.take(0.02 if self.pending else 0.5)
            if items:
                time.sleep(SETTLE_S)
                more, _ = self.sub.take(0)
                items += more
            elif not self.pending:
                continue
            try:
                self.process(items)
            except Exception:
                log.exception("stall detector failed on a batch; continuing")

    def process(self, items):
        """Feed (kind, pa.Table) items; publishes and returns the alerts table."""
        spans = []
        for kind, batch in items:
            if kind == event_kinds.GC_PASS:
                self.gc.add(
                    batch["run_id"].to_numpy(zero_copy_only=False),
                    batch["start_ns"].to_numpy(zero_copy_only=False),
                    batch["end_ns"].to_numpy(zero_copy_only=False),
                    batch["generation"].to_numpy(zero_copy_only=False),
                )
            elif kind == event_kinds.OFF_CPU:
                self.offcpu.add(
                    batch["tid"].to_numpy(zero_copy_only=False),
                    batch["start_ns"].to_numpy(zero_copy_only=False),
                    batch["end_ns"].to_numpy(zero_copy_only=False),
                    offcpu_weights(batch),
                )
            elif kind == event_kinds.SPAN:
                spans.append(batch)
        rows = self._release_pending(time.monotonic())
        latest_ns = 0
        for batch in spans:
            steps = batch.filter(pc.fill_null(pc.equal(batch["kind"], "step"), False))
            if steps.num_rows == 0:
                continue
            rows.extend(self._check_steps(steps))
            latest_ns = max(latest_ns, pc.max(steps["end_ns"]).as_py() or 0)
        if latest_ns:
            self.gc.prune(latest_ns)
            self.offcpu.prune(latest_ns)
        if not rows:
            return None
        table = pa.table({c: [r[c] for r in rows] for c in ALERT_COLUMNS})
        self.alerts_sent += len(rows)
        self.fanout.on_batch("stall_alerts", table)
        return table

    def _check_steps(self, steps):
        runs = self.fanout.runs_for([(event_kinds.SPAN, steps)])
        marked = (
            steps["idle"].to_pylist() if "idle" in steps.column_names else [False] * steps.num_rows
        )
        out = []
        for run_id, tid, stage, size, s, e, idle_mark in zip(
            steps["run_id"].to_pylist(),
            steps["tid"].to_pylist(),
            steps["stage"].to_pylist(),
            steps["batch"].to_pylist(),
            steps["start_ns"].to_pylist(),
            steps["end_ns"].to_pylist(),
            marked,
            strict=True,
        ):
            self.steps_seen += 1
            if size:
                self.reports_batch.add((run_id, tid))
            if rules.is_idle(size, idle_mark, (run_id, tid) in self.reports_batch):
                self.idle_steps += 1  # never slow, and out of the medians
                continue
            dur = e - s
            median, n = self.baselines.observe((run_id, stage, size), dur)
            if median is None or n < self.min_samples or median <= 0 or dur <= self.factor * median:
                continue
            if dur - median < self.min_excess_ns:
                self.small_excess += 1  # slow by the ratio, too small to act on
                continue
            args = (runs, run_id, tid, stage, size, s, e, dur, median)
            alert = self._alert(*args)
            if alert["cause"] == "unexplained" and self.hold_unexplained_s > 0:
                self.pending.append((time.monotonic() + self.hold_unexplained_s, args))
            else:
                out.append(alert)
        return out

    def _release_pending(self, now):
        """Alerts held for late events: those now explained, or out of time."""
        out, keep = [], []
        for deadline, args in self.pending:
            alert = self._alert(*args)
            if alert["cause"] != "unexplained" or now >= deadline:
                out.append(alert)
            else:
                keep.append((deadline, args))
        self.pending = keep
        return out

    def _alert(self, runs, run_id, tid, stage, size, s, e, dur, median):
        gc_gen = -1
        gc_a, gc_b, gens = self.gc.clip(run_id, s, e)
        if gc_a is not None and len(gc_a):
            gc_gen = int(gens.max())
        off_ns = pre_ns = 0
        sampled = False
        off_a, off_b, w = self.offcpu.clip(tid, s, e)
        if off_a is not None and len(off_a):
            inter = off_b - off_a
            off_ns = int((inter * w[:, 0]).sum())
            pre_ns = int((inter * (w[:, 1] - w[:, 3])).sum())  # a yield is no preemption
            sampled = bool(w[:, 2].any())
        parts = alert_parts(gc_a, gc_b, off_a, off_b, w)
        return {
            "run_id": run_id,
            "pid": runs.get(run_id) or 0,
            "tid": tid,
            "stage": stage or "",
            "batch": size or 0,
            "start_ns": s,
            "end_ns": e,
            "duration_ns": dur,
            "baseline_ns": int(median),
            "ratio": dur / median,
            "gc_overlap_ns": int(parts["gc"]),
            "gc_generation": gc_gen,
            "offcpu_ns": off_ns,
            "preempted_ns": pre_ns,
            "cause": rules.name_cause(dur - median, parts),
            "offcpu_sampled": sampled,
        }
