"""The hang watchdog: notices a run that stopped making progress and dumps every thread.

Wiring around `store.hangs.HangDetector` (a store listener that folds step
ends) and `probes.hang_proc` (the /proc reader). Its own thread ticks when
a run could first be hung (every TICK_S to MAX_TICK_S): runs that became
hung get one `hang_dumps` row per episode and,
unless a dump of the same run was taken less than `min_dump_interval_s`
ago (then the row says so and the episode is still counted), their threads
in `hang_dump_frames`: a thread the CPU sampler saw on CPU in the last
SAMPLER_FRESH_NS keeps the sampler's stack (native leaf included, frame ids
the sampler already stored), every other thread its Python stack read
through /proc/PID/mem (frames added to `cpu_frames` with negative ids, so
they never meet the sampler's), and each thread its kernel state. Runs that
recovered get their `recovered_ns`. Nothing here stops, signals or ptraces
the traced process; a failing capture is counted and logged, never raised
into the daemon. A dump holds every thread of the hung process and of the
other connected processes of its run group (`group_pids`; each frame row
says its `pid`). `stacks(pid)` is the same capture on demand
(`stallscope stacks`), without rows. `to_fanout` streams each episode's
start and end to the API's live subscribers (the Hung event).
"""

import logging
import threading
import time

import pyarrow as pa

from stallscope import threads
from stallscope.probes import hang_proc
from stallscope.probes.cpu_bcc import BccCpuProbe, Refused
from stallscope.store.hangs import HangDetector
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

TICK_S = 0.2
# Between ticks it sleeps until the first run could be found hung (the
# detector's next_due_ns: a busy run's threshold less its silence), at
# least TICK_S and at most MAX_TICK_S (a run that turns busy meanwhile, or
# a per-run threshold below the default, is looked at within it): an engine
# at 200 steps/s with a 5 s threshold costs ~1 tick a second, not 5.
MAX_TICK_S = 1.0
# With no run watched (no step seen yet), a tick is due this rarely: an idle
# daemon wakes only a few times a second (tests/store/test_footprint.py).
IDLE_TICK_S = 1.0
# Columns of a `hang_events` row that are numbers, 0 when unknown.
EVENT_NUMBERS = "run_id pid dump_id detected_ns threshold_ns last_step_end_ns recovered_ns".split()
# A sampler stack younger than this stands for a thread found running.
SAMPLER_FRESH_NS = 2_000_000_000
# Processes in one dump at most: the hung one and its run group's others.
MAX_GROUP_PIDS = 16


class HangWatchdog:
    def __init__(
        self,
        daemon,
        threshold_ms=0.0,
        min_threshold_ms=5000.0,
        p99_factor=10.0,
        min_dump_interval_s=60.0,
    ):
        self.daemon = daemon
        self.store = daemon.store
        self.proc_root = daemon.settings.proc_root
        self.detector = HangDetector(
            self._run_pids,
            threshold_ns=int(threshold_ms * 1e6),
            min_threshold_ns=int(min_threshold_ms * 1e6),
            p99_factor=p99_factor,
        )
        self.min_dump_interval_s = float(min_dump_interval_s)
        self.layouts = {}  # pid -> (fields, version) from a checked PYLAYOUT
        self.tstates = {}  # pid -> {tid: PyThreadState address}
        self.listeners = []  # fn(kind, info): 'hung' / 'recovered' (the API's stream)
        self._frame_ids = {}  # (kind, file, function, line) -> frame id (negative)
        self._next_frame_id = -time.time_ns()
        self._next_dump_id = time.time_ns()
        self._last_dump = {}  # run_id -> monotonic s of its last dump
        self._capture_lock = threading.Lock()  # one capture at a time
        self.dumps_taken = 0
        self.dumps_rate_limited = 0
        self.capture_errors = 0
        self.last_capture_ns = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stallscope-hangs", daemon=True)

    # ----- life ------------------------------------------------------------------------------
    def start(self):
        self.store.add_listener(self.detector.on_batch)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self.store.remove_listener(self.detector.on_batch)
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def _run_pids(self):
        """{run_id: pid} of connected runs; their own thresholds go to the detector."""
        out = {}
        for run in list(self.daemon.ingest.runs.values()):
            if run.connected:
                out[run.run_id] = run.pid
                if run.hang_threshold_ns:
                    watch = self.detector.runs.get(run.run_id)
                    if watch is None or watch.override_ns != run.hang_threshold_ns:
                        self.detector.set_override(run.run_id, run.hang_threshold_ns)
        return out

    def group_pids(self, pid):
        """The processes dumped with `pid`: it first, then the other connected
        processes of its run group (the peer a hung step waits on is often
        the culprit: a vLLM engine core waiting for its workers), at most
        MAX_GROUP_PIDS in all."""
        runs = [r for r in list(self.daemon.ingest.runs.values()) if r.connected]
        keys = {getattr(r, "group_key", None) for r in runs if r.pid == pid}
        keys.discard(None)
        out = [pid]
        for r in sorted(runs, key=lambda r: r.run_id):
            if getattr(r, "group_key", None) in keys and r.pid not in out and r.pid:
                out.append(r.pid)
        return out[:MAX_GROUP_PIDS]

    # ----- what clients report (service/server.py hands it over) -----------------------------
    def accept_layout(self, pid, info):
        try:
            self.layouts[pid] = BccCpuProbe.check_layout(info)
        except (Refused, KeyError, TypeError, ValueError, AttributeError, OverflowError):
            self.layouts.pop(pid, None)

    def set_threads(self, pid, pairs):
        self.tstates[pid] = {int(t): int(a) for t, a in pairs}

    def forget(self, pid):
        self.layouts.pop(pid, None)
        self.tstates.pop(pid, None)

    # ----- the tick ------------------------------------------------------------------------------
    def _loop(self):
        threads.paced("hang-watchdog")  # a hung engine may hold every CPU but ours
        while not self._stop.wait(self._next_tick_s()):
            try:
                self.tick(time.monotonic_ns())
            except Exception:
                log.exception("hang watchdog: tick failed; continuing")

    def _next_tick_s(self):
        if not self.detector.runs:
            return IDLE_TICK_S
        due = self.detector.next_due_ns
        if due is None:
            return MAX_TICK_S
        return min(max(due / 1e9, TICK_S), MAX_TICK_S)

    def tick(self, now_ns):
        seen = getattr(self.daemon.ingest, "caught_up_ns", None)
        started, ended = self.detector.check(now_ns, seen)
        for ep in started:
            self._episode(ep)
        for ep in ended:
            self._ended(ep)

    def _episode(self, ep):
        ep.token = dump_id = self._next_dump_id = self._next_dump_id + 1
        log.warning("run %d (pid %d) hung: %s", ep.run_id, ep.pid, ep.reason)
        now = time.monotonic()
        last = self._last_dump.get(ep.run_id)
        lacks, rows, capture_ns, n_threads = None, None, None, 0
        if last is not None and now - last < self.min_dump_interval_s:
            self.dumps_rate_limited += 1
            lacks = (
                f"rate-limited: a dump of this run {now - last:.0f} s ago "
                f"(hang.min_dump_interval_s {self.min_dump_interval_s:g})"
            )
        else:
            self._last_dump[ep.run_id] = now
            try:
                found, lacks, capture_ns = self.capture(ep.pid)
                n_threads = len(found)
                rows = self._frame_rows(dump_id, ep.run_id, found)
                self.dumps_taken += 1
            except Exception as exc:
                self.capture_errors += 1
                lacks = f"capture failed: {type(exc).__name__}: {exc}"
                log.exception("hang watchdog: capture of pid %d failed", ep.pid)
        self.store.append(
            "hang_dumps",
            {
                "dump_id": [dump_id],
                "run_id": [ep.run_id],
                "pid": [ep.pid],
                "detected_ns": [ep.detected_ns],
                "reason": [ep.reason],
                "threshold_ns": [ep.threshold_ns],
                "last_step_end_ns": [ep.last_step_end_ns],
                "recovered_ns": [None],
                "threads": [n_threads],
                "capture_ns": [capture_ns],
                "lacks": [lacks],
            },
        )
        if rows is not None:
            self.store.append("hang_dump_frames", rows)
        self._tell("hung", ep, dump_id=dump_id, threads=n_threads, lacks=lacks)

    def _ended(self, ep):
        if ep.recovered_ns:
            self.store.sql(
                "UPDATE hang_dumps SET recovered_ns = ?, "
                "stored_ns = getvariable('stallscope_stored_ns') WHERE dump_id = ?",
                [ep.recovered_ns, ep.token],
            )
            log.warning(
                "run %d recovered after %.1f s",
                ep.run_id,
                (ep.recovered_ns - ep.last_step_end_ns) / 1e9,
            )
        self._tell("recovered" if ep.recovered_ns else "left", ep, dump_id=ep.token)

    def _tell(self, kind, ep, **extra):
        info = {
            "run_id": ep.run_id,
            "pid": ep.pid,
            "detected_ns": ep.detected_ns,
            "threshold_ns": ep.threshold_ns,
            "last_step_end_ns": ep.last_step_end_ns,
            "recovered_ns": ep.recovered_ns or None,
            "reason": ep.reason,
            **extra,
        }
        for fn in list(self.listeners):
            try:
                fn(kind, info)
            except Exception:
                log.exception("hang watchdog: a listener failed")

    @staticmethod
    def to_fanout(fanout):
        """A listener that streams each episode's news as a `hang_events`
        batch of one row (event kind HUNG, the proto's Hung)."""

        def listener(kind, info):
            ts = info["recovered_ns"] if kind == "recovered" else None
            row = {
                "state": kind,
                "ts_ns": ts or info["detected_ns"],
                "threads": info.get("threads") or 0,
                "lacks": info.get("lacks") or "",
                **{k: info.get(k) or 0 for k in EVENT_NUMBERS},
                "reason": info["reason"],
            }
            fanout.on_batch("hang_events", pa.table({k: [v] for k, v in row.items()}))

        return listener

    # ----- capture ----------------------------------------------------------------------------
    def capture(self, pid, group=True):
        """([thread dicts with 'source' and 'frame_ids'], lacks, capture ns) of
        every thread of `pid` (and, with `group`, of its run group's other
        processes), read while it runs."""
        with self._capture_lock:
            t0 = time.monotonic_ns()
            found, lacks_all = [], []
            probe = self.daemon._probe("cpu")
            latest = dict(getattr(getattr(probe, "stacks", None), "latest", None) or {})
            for p in self.group_pids(pid) if group else [pid]:
                got, lacks = hang_proc.read_threads(
                    p, self.proc_root, self.layouts.get(p), self.tstates.get(p)
                )
                if lacks:
                    lacks_all.append(f"pid {p}: {lacks}")
                for t in got:
                    t["pid"] = p
                    sample = latest.get(t["tid"])
                    if t["state"] == "R" and sample and t0 - sample[0] <= SAMPLER_FRESH_NS:
                        t["source"], t["frame_ids"] = "sampler", list(sample[1])
                    elif t["frames"]:
                        t["source"] = "proc_mem"
                        t["frame_ids"] = None  # named by _frame_rows
                    else:
                        t["source"], t["frame_ids"] = "none", []
                    found.append(t)
            if probe is None:
                lacks_all.append("no CPU sampler: no native leaf for running threads")
            self.last_capture_ns = time.monotonic_ns() - t0
            return found, "; ".join(lacks_all) or None, self.last_capture_ns

    def _frame_id(self, content, new):
        fid = self._frame_ids.get(content)
        if fid is None:
            self._next_frame_id -= 1
            fid = self._frame_ids[content] = self._next_frame_id
            new.append((fid, content))
        return fid

    def _frame_rows(self, dump_id, run_id, found):
        """hang_dump_frames columns for a capture (and its new cpu_frames rows, appended)."""
        new = []
        cols = {
            k: []
            for k in (
                "dump_id run_id pid tid thread_name state wchan syscall cpu_ns source walk "
                "depth frame_id"
            ).split()
        }
        for t in found:
            ids = t["frame_ids"]
            if ids is None:
                ids = [self._frame_id(("py", f, fn, ln), new) for f, fn, ln in t["frames"]]
            for depth, fid in enumerate(ids or [None]):
                cols["dump_id"].append(dump_id)
                cols["run_id"].append(run_id)
                cols["pid"].append(t["pid"])
                cols["tid"].append(t["tid"])
                cols["thread_name"].append(t["name"])
                cols["state"].append(t["state"])
                cols["wchan"].append(t["wchan"])
                cols["syscall"].append(t["syscall"])
                cols["cpu_ns"].append(t["cpu_ns"])
                cols["source"].append(t["source"])
                cols["walk"].append(t["walk"])
                cols["depth"].append(depth)
                cols["frame_id"].append(fid)
        if new:
            now = time.monotonic_ns()
            self.store.append(
                "cpu_frames",
                {
                    "frame_id": [f for f, _ in new],
                    "kind": [c[0] for _, c in new],
                    "file": [c[1] for _, c in new],
                    "function": [c[2] for _, c in new],
                    "line": [c[3] for _, c in new],
                    "first_ts_ns": [now] * len(new),
                },
            )
        if len(self._frame_ids) > 1 << 16:
            self._frame_ids.clear()  # a bounded cache: a frame seen again gets a new id
        return cols

    # ----- on demand -----------------------------------------------------------------------
    def stacks(self, pid):
        """Every thread of a traced `pid` now, for `stallscope stacks`:
        {'pid', 'threads': [{tid, name, state, wchan, syscall, source,
        frames: [(file, function, line)]}], 'lacks', 'capture_ns'}."""
        # this process only: its owner may see it, not its group's others
        found, lacks, capture_ns = self.capture(pid, group=False)
        names = self._names_of_ids(
            {i for t in found if t["source"] == "sampler" for i in t["frame_ids"]}
        )
        out = []
        for t in found:
            frames = t["frames"]
            if t["source"] == "sampler":
                frames = [names.get(i, (None, "<unknown>", None)) for i in t["frame_ids"]]
            out.append(
                {
                    "tid": t["tid"],
                    "name": t["name"],
                    "state": t["state"],
                    "wchan": t["wchan"],
                    "syscall": t["syscall"],
                    "source": t["source"],
                    "frames": [list(f) for f in frames],
                }
            )
        return {"pid": pid, "threads": out, "lacks": lacks, "capture_ns": capture_ns}

    def _names_of_ids(self, ids):
        if not ids:
            return {}
        cur = self.store.cursor()
        try:
            rows = cur.execute(
                "SELECT frame_id, file, function, line FROM cpu_frames "
                "WHERE frame_id IN (SELECT unnest(?::BIGINT[]))",
                [sorted(ids)],
            ).fetchall()
        finally:
            cur.close()
        return {r[0]: (r[1], r[2], r[3]) for r in rows}

    # ----- what status and /metrics say ------------------------------------------------------
    def summary(self):
        now = time.monotonic_ns()
        return {
            "hangs_total": self.detector.hangs_total,
            "recoveries_total": self.detector.recoveries_total,
            "dumps_taken": self.dumps_taken,
            "dumps_rate_limited": self.dumps_rate_limited,
            "capture_errors": self.capture_errors,
            "hung_runs": [ep.run_id for ep in self.detector.hung_runs()],
            "seconds_since_step": self.detector.silence(now),
        }
