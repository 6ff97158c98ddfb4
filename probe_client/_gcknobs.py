"""GC forensics of a probe: the heap census schedule and the A/B knobs (freeze, threshold).

`GcForensics` is a base of `Probe`. With `census=True` it sends a census
(`_census.py`) at connect, or at `mark("warm")`, or `census_after_s` seconds
after connect, and at close. The knobs apply the patch the seed report
offered to test, without editing the engine: `gc_threshold=(A, B, C)` is
`gc.set_threshold` before the HELLO (so the run records it), and
`gc_freeze_after_s=S` runs `gc.collect()` then `gc.freeze()` S seconds after
connect, from a daemon thread, and reports it as a `gc_freeze` run event.
The knobs applied are in the HELLO (`runs.gc_freeze_after_s`,
`runs.gc_threshold_set`). Nothing here runs on the engine's hot path, and
nothing raises into the engine once the probe exists (a bad knob value is
refused at `connect()` with ValueError). Standard library only.
"""

import gc as _gc
import os
import threading
import time

from . import _census, wire

CENSUS_ENV = "STALLSCOPE_CENSUS"  # "1": take a census (connect(census=None))
CENSUS_AFTER_ENV = "STALLSCOPE_CENSUS_AFTER"  # seconds after connect for the start census
CENSUS_TOP_ENV = "STALLSCOPE_CENSUS_TOP"  # types listed per census (default 30)
FREEZE_AFTER_ENV = "STALLSCOPE_GC_FREEZE_AFTER"  # seconds: gc.collect(); gc.freeze()
THRESHOLD_ENV = "STALLSCOPE_GC_THRESHOLD"  # "A,B,C": gc.set_threshold(A, B, C)


def parse_threshold(text):
    """`A[,B[,C]]` as a tuple of non-negative ints; ValueError says what is wrong."""
    if isinstance(text, (tuple, list)):
        parts = list(text)
    else:
        parts = [p.strip() for p in str(text).split(",")]
    try:
        values = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        raise ValueError(f"GC threshold wants 1 to 3 integers A,B,C, not {text!r}") from None
    if not 1 <= len(values) <= 3 or min(values) < 0:
        raise ValueError(f"GC threshold wants 1 to 3 non-negative integers A,B,C, not {text!r}")
    return values


def parse_seconds(text, what):
    """A non-negative number of seconds; ValueError names `what`."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{what} wants seconds (a number), not {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{what} wants a finite number of seconds >= 0, not {text!r}")
    return value


def settings_from_environment(environ=None):
    """connect() keywords from $STALLSCOPE_CENSUS, _CENSUS_AFTER, _CENSUS_TOP,
    _GC_FREEZE_AFTER and _GC_THRESHOLD (ValueError on a bad value)."""
    env = os.environ if environ is None else environ
    out = {}
    if env.get(CENSUS_ENV, "") not in ("", "0"):
        out["census"] = True
    if env.get(CENSUS_AFTER_ENV):
        out["census_after_s"] = parse_seconds(env[CENSUS_AFTER_ENV], CENSUS_AFTER_ENV)
    if env.get(CENSUS_TOP_ENV):
        out["census_top"] = int(parse_seconds(env[CENSUS_TOP_ENV], CENSUS_TOP_ENV))
    if env.get(FREEZE_AFTER_ENV):
        out["gc_freeze_after_s"] = parse_seconds(env[FREEZE_AFTER_ENV], FREEZE_AFTER_ENV)
    if env.get(THRESHOLD_ENV):
        out["gc_threshold"] = parse_threshold(env[THRESHOLD_ENV])
    return out


class GcForensics:
    """Census schedule and GC knobs of one probe (a base of `Probe`)."""

    def _init_gc_forensics(self, census, census_after_s, census_top, freeze_after_s, threshold):
        """Before the first connection: apply the threshold, take the start
        census (unless it waits for a timer), record the knobs for the HELLO."""
        if census is None:
            census = os.environ.get(CENSUS_ENV, "") not in ("", "0")
        knobs = {}
        if threshold is not None:
            values = parse_threshold(threshold)
            _gc.set_threshold(*values)
            knobs["threshold"] = list(values)
        if freeze_after_s is not None:
            knobs["freeze_after_s"] = parse_seconds(freeze_after_s, "gc_freeze_after_s")
        if census_after_s is not None:
            census_after_s = parse_seconds(census_after_s, "census_after_s")
        self._gc_knobs = knobs or None
        self._knob_lock = threading.Lock()
        self._closed_knobs = False  # set at close: a freeze not begun is not begun
        self._census = None
        self._census_top = _census.DEFAULT_TOP_N if census_top is None else max(1, int(census_top))
        self._census_base = None  # the start/warm census's full histogram (bytes: untracked)
        if census:
            self._census = "waiting" if census_after_s is not None else "start"
            if census_after_s is None:
                self._take_census("start")
        timers = []
        if census and census_after_s is not None:
            timers.append((census_after_s, self._census_timer))
        if freeze_after_s is not None:
            timers.append((knobs["freeze_after_s"], self._freeze_timer))
        for delay_s, target in sorted(timers, key=lambda t: t[0]):
            threading.Thread(
                target=_after, args=(delay_s, target), name="stallscope-gc-knob", daemon=True
            ).start()

    def mark(self, name):
        """Say that the engine reached `name` (a run event); `mark("warm")`
        with a census takes the warm census now (growth is counted from it).
        Never raises; costs a census (a full heap walk) when it takes one."""
        try:
            if name == "warm" and self._census is not None and not self._closed:
                self._take_census("warm")
            self.event("mark", str(name)[:200], f"mark {name!r}")
        except Exception:
            self.errors += 1

    def _census_timer(self):
        if not self._closed and self._census == "waiting":
            self._take_census("warm")

    def _freeze_timer(self):
        with self._knob_lock:  # close() waits: the event must not be lost at exit
            self._freeze_locked()

    def _freeze_locked(self):
        if self._closed or self._closed_knobs:
            return
        t0 = time.monotonic_ns()
        _gc.collect()
        before = _gc.get_freeze_count()
        _gc.freeze()
        frozen = _gc.get_freeze_count() - before
        ms = (time.monotonic_ns() - t0) / 1e6
        self.event(
            "gc_freeze",
            "",
            f"gc.collect() then gc.freeze() {self._gc_knobs['freeze_after_s']:g} s after "
            f"connect: {frozen} objects frozen (freeze count {before + frozen}; took {ms:.1f} ms)",
            ts_ns=t0,  # just before the collect: the daemon finds the pass it forced
        )
        if self._census is not None and not self._closed:
            # The census skips frozen objects: growth is counted from here.
            self._take_census("warm")

    def _close_census(self):
        """At close, before anything else: let a running freeze finish and
        report, then the close census."""
        with self._knob_lock:
            self._closed_knobs = True
        if self._census is not None:
            self._take_census("close")
            self._census = None

    def _take_census(self, phase):
        try:
            base = self._census_base if phase == "close" else None
            payload, histogram = _census.take_census(phase, self._census_top, base)
            if phase != "close":
                self._census_base = histogram
                self._census = "taken"
            del histogram
            with self._lock:
                self._queue_control(wire.DGRAM_CENSUS, payload, time.monotonic_ns())
        except Exception:
            self.errors += 1


def _after(delay_s, target):
    time.sleep(delay_s)
    try:
        target()
    except Exception:
        pass
