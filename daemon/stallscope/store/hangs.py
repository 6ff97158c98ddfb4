"""Hang detection: a run whose steps stopped ending while it had work.

A store listener (`on_batch`, called by the store on the appending thread)
folds each `spans` batch into per-run state: the end of the latest step
(span kind "step"), whether that step was idle (the step rules of
`stallscope.vocab.rules`: batch 0 on a thread that reports batches, or
marked idle) and the durations of the last `window` busy steps. `check(now_ns)`,
called by the service's watchdog thread, says which runs became hung and
which recovered: a run is hung when no step has ended for longer than its
threshold (a per-run override from the client's HELLO, else the configured
threshold, else max(p99_factor x the p99 of its recent busy steps,
min_threshold)) while it has work. "Has work" is, for now, "its last step
was not idle": an engine that reports idle steps while it waits for
requests is never hung. `has_work` is the seam for the requests issue
(requests in flight make a run busy whatever its last step was). An
episode ends at the first step end after it (recovered) or when the run
leaves. Silence is measured up to ingest's watermark (what clients sent
before it has been folded), not to the clock: under load the daemon's
main loop may read late, and its queued step ends are not a hang. This
module never queries the database and never blocks the
appending thread: the fold is a few numpy reductions per batch.
"""

import threading
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pyarrow.compute as pc

DEFAULT_MIN_THRESHOLD_NS = 5_000_000_000
DEFAULT_P99_FACTOR = 10.0
WINDOW_STEPS = 256


@dataclass
class RunWatch:
    """What the detector knows of one run."""

    run_id: int
    last_end_ns: int = 0
    last_idle: bool = True
    durations: deque = field(default_factory=lambda: deque(maxlen=WINDOW_STEPS))
    reports_batch: set = field(default_factory=set)  # tids that sent a batch size > 0
    override_ns: int = 0
    hung_since_ns: int = 0  # detection time of the open episode, 0: none
    episode: object = None  # what the watchdog attached to the open episode
    recovered_ns: int = 0  # first step end after the episode (until taken)


@dataclass
class Episode:
    run_id: int
    pid: int
    detected_ns: int
    last_step_end_ns: int
    threshold_ns: int
    reason: str
    recovered_ns: int = 0
    token: object = None


class HangDetector:
    """Per-run last step end, idleness and recent step durations; see module doc."""

    def __init__(
        self,
        run_pids,
        threshold_ns=0,
        min_threshold_ns=DEFAULT_MIN_THRESHOLD_NS,
        p99_factor=DEFAULT_P99_FACTOR,
    ):
        self.run_pids = run_pids  # () -> {run_id: pid} of connected runs
        self.threshold_ns = int(threshold_ns)
        self.min_threshold_ns = int(min_threshold_ns)
        self.p99_factor = float(p99_factor)
        self._lock = threading.Lock()
        self.runs = {}  # run_id -> RunWatch
        self.hangs_total = 0
        self.recoveries_total = 0
        # after check(): ns until the first run could be found hung (0: one is
        # hung; None: no run is busy), so the watchdog need not tick before
        self.next_due_ns = None

    # ----- the store listener (appending thread) ---------------------------------------
    def on_batch(self, table, batch):
        if table != "spans" or batch.num_rows == 0:
            return
        is_step = pc.fill_null(pc.equal(batch["kind"].cast("string"), "step"), False)
        steps = batch.filter(is_step)
        if steps.num_rows == 0:
            return
        run_ids = steps["run_id"].to_numpy(zero_copy_only=False)
        ends = steps["end_ns"].to_numpy(zero_copy_only=False).astype(np.int64)
        starts = steps["start_ns"].to_numpy(zero_copy_only=False).astype(np.int64)
        tids = steps["tid"].to_numpy(zero_copy_only=False)
        sizes = pc.fill_null(steps["batch"], 0).to_numpy(zero_copy_only=False)
        marked = (
            pc.fill_null(steps["idle"], False).to_numpy(zero_copy_only=False)
            if "idle" in steps.column_names
            else np.zeros(steps.num_rows, dtype=bool)
        )
        with self._lock:
            for run_id in np.unique(run_ids).tolist():
                sel = np.flatnonzero(run_ids == run_id)
                watch = self.runs.get(run_id)
                if watch is None:
                    watch = self.runs[run_id] = RunWatch(run_id)
                self._fold(watch, tids[sel], sizes[sel], marked[sel], starts[sel], ends[sel])

    @staticmethod
    def _fold(watch, tids, sizes, marked, starts, ends):
        """One run's steps, in arrival order, into its watch (lock held):
        what a loop over them would do, with numpy (a Python loop per step
        was a third of the main loop's decode time at 200 steps/s). A step's
        thread reports batches when an earlier batch did or a step of it up
        to this one had a batch size (rules.is_idle)."""
        n = len(tids)
        order = np.arange(n)
        uniq, inv = np.unique(tids, return_inverse=True)
        sized = sizes != 0
        first_sized = np.full(len(uniq), n)
        np.minimum.at(first_sized, inv[sized], order[sized])
        known = np.fromiter((t in watch.reports_batch for t in uniq.tolist()), bool, len(uniq))
        reports = known[inv] | (first_sized[inv] <= order)
        idle = marked.astype(bool) | (reports & ~sized)
        watch.reports_batch.update(uniq[first_sized < n].tolist())
        watch.durations.extend((ends - starts)[~idle].tolist())
        last = int(ends.max())
        if last >= watch.last_end_ns:
            watch.last_end_ns = last
            watch.last_idle = bool(idle[np.flatnonzero(ends == last)[-1]])
        if watch.hung_since_ns and not watch.recovered_ns:
            watch.recovered_ns = int(ends[0])

    # ----- settings ----------------------------------------------------------------------
    def set_override(self, run_id, threshold_ns):
        """A per-run threshold (the client's HELLO); 0 clears it."""
        with self._lock:
            watch = self.runs.get(run_id)
            if watch is None:
                watch = self.runs[run_id] = RunWatch(run_id)
            watch.override_ns = max(0, int(threshold_ns))

    def threshold_for(self, watch):
        """(threshold ns, how it was chosen) of a run (lock held)."""
        if watch.override_ns:
            return watch.override_ns, "per-run threshold"
        if self.threshold_ns:
            return self.threshold_ns, "configured threshold"
        p99 = float(np.percentile(np.fromiter(watch.durations, np.int64), 99))
        auto = int(self.p99_factor * p99)
        if auto > self.min_threshold_ns:
            return auto, f"{self.p99_factor:g} x p99 step ({p99 / 1e6:.1f} ms)"
        return self.min_threshold_ns, "minimum threshold"

    @staticmethod
    def has_work(watch):
        """Whether a run has work to do (lock held). The requests issue adds
        "requests in flight" here; until then, the last step was not idle."""
        return not watch.last_idle

    # ----- the watchdog's tick ---------------------------------------------------------------
    def check(self, now_ns, seen_upto_ns=None):
        """(episodes that started, episodes that ended) since the last check;
        sets `next_due_ns`.
        An ended episode carries recovered_ns (0 when the run left while hung).
        `seen_upto_ns`: the time before which every step end a client sent
        has been folded here (ingest's watermark); silence is measured up to
        it, so a step end still queued in the daemon is never a hang."""
        started, ended = [], []
        upto = now_ns if seen_upto_ns is None else min(now_ns, seen_upto_ns)
        pids = self.run_pids()
        dues = []  # ns until each busy run could be found hung, as of this check
        with self._lock:
            for run_id, watch in list(self.runs.items()):
                if watch.hung_since_ns:
                    dues.append(0)  # its recovery is looked for at every tick
                    if watch.recovered_ns or run_id not in pids:
                        ep = watch.episode
                        ep.recovered_ns = watch.recovered_ns
                        ended.append(ep)
                        self.recoveries_total += bool(watch.recovered_ns)
                        watch.hung_since_ns = watch.recovered_ns = 0
                        watch.episode = None
                    continue
                if run_id not in pids:
                    if not watch.override_ns or watch.last_end_ns:
                        del self.runs[run_id]  # gone (an override waits for its first step)
                    continue
                if not watch.last_end_ns or not watch.durations or not self.has_work(watch):
                    continue
                threshold, how = self.threshold_for(watch)
                silent = upto - watch.last_end_ns
                if silent <= threshold:
                    dues.append(threshold - silent + 1)
                    continue
                reason = (
                    f"no step end for {silent / 1e9:.1f} s (threshold {threshold / 1e9:.1f} s: "
                    f"{how}) after a busy step"
                )
                ep = Episode(run_id, pids[run_id], now_ns, watch.last_end_ns, threshold, reason)
                watch.hung_since_ns = now_ns
                watch.episode = ep
                self.hangs_total += 1
                started.append(ep)
                dues.append(0)
            self.next_due_ns = min(dues) if dues else None
        return started, ended

    def silence(self, now_ns):
        """{run_id: seconds since its last step end} of connected runs with a step."""
        pids = self.run_pids()
        with self._lock:
            return {
                r: (now_ns - w.last_end_ns) / 1e9
                for r, w in self.runs.items()
                if w.last_end_ns and r in pids
            }

    def hung_runs(self):
        with self._lock:
            return [w.episode for w in self.runs.values() if w.hung_since_ns]
