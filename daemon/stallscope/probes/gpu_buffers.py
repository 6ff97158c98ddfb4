"""The GPU probe's second source: the driver's sample buffers, and their clock.

`DriverBuffers` is the part of `NvmlGpuProbe` that drains each GPU's
nvmlDeviceGetSamples buffers (processor clock and power, every sample the
driver took, at ~20 ms), records an overrun as a loss, and calibrates the
buffers' undocumented microsecond clock to CLOCK_MONOTONIC from the reads it
made (`calibrate`, method in docs/gpu-probe.md, rows in `nvml_clock_sync`).
It works on the probe's GPUs, counters and sink (a base class of
NvmlGpuProbe, not usable alone) and never raises for a failing buffer: the
field is marked unsupported, or the GPU lost.
"""

import statistics
import time
from itertools import pairwise

from stallscope.probes.nvml_bindings import sample_value

# nvmlDeviceGetSamples types (values from nvml.h)
TOTAL_POWER_SAMPLES = 0
PROCESSOR_CLK_SAMPLES = 5
BUFFER_TYPES = ((PROCESSOR_CLK_SAMPLES, "sm_clock_mhz"), (TOTAL_POWER_SAMPLES, "power_mw"))

# Candidate clocks for the driver's sample timestamps, in order of preference.
CANDIDATE_CLOCKS = (
    ("realtime", time.CLOCK_REALTIME),
    ("boottime", getattr(time, "CLOCK_BOOTTIME", 7)),
    ("monotonic", time.CLOCK_MONOTONIC),
)


def _clock_offset_ns(clock_id, tries=5):
    """(candidate clock minus CLOCK_MONOTONIC, error bound) in ns, best bracket."""
    best = None
    for _ in range(tries):
        a = time.monotonic_ns()
        c = time.clock_gettime_ns(clock_id)
        b = time.monotonic_ns()
        if best is None or b - a < best[1] * 2:
            best = (c - (a + b) // 2, (b - a + 1) // 2)
    return best


class GpuLost(Exception):
    """The GPU stopped answering (lost, reset required, driver gone)."""


def raiser(exc):
    """A call that raises `exc` (to send an error through the probe's _call)."""

    def fn():
        raise exc

    return fn


class DriverBuffers:
    # ----- driver sample buffers ---------------------------------------------------
    def read_buffers(self):
        """Drain new samples from each GPU's driver buffers."""
        self._last_buffer_ns = time.monotonic_ns()
        nv = self.nv
        for g in self.gpus:
            if g.lost_since_ns is not None:
                continue
            for stype, column in BUFFER_TYPES:
                key = f"buffer_{column}"
                if key in g.unsupported:
                    continue
                last = g.last_seen_us.get(stype, 0)
                t0 = time.monotonic_ns()
                try:
                    _vtype, samples = nv.nvmlDeviceGetSamples(g.handle, stype, last)
                except nv.NVMLError_NotFound:
                    continue  # no sample newer than `last`: normal
                except nv.NVMLError as exc:
                    try:
                        self._call(g, key, raiser(exc))
                    except GpuLost as lost:
                        self._mark_lost(g, t0, str(lost))
                        break
                    continue
                t1 = time.monotonic_ns()
                fresh = sorted(
                    (int(s.timeStamp), s.sampleValue) for s in samples if int(s.timeStamp) > last
                )
                if not fresh:
                    continue
                stamps = [ts for ts, _ in fresh]
                if len(stamps) > 1:
                    period = round(statistics.median(b - a for a, b in pairwise(stamps)))
                    if period > 0:
                        g.period_us[stype] = int(period)
                if last == 0:
                    g.depth[stype] = len(samples)
                    self._fit_buffer_poll(g, stype)
                period = g.period_us.get(stype)
                # an overrun is a full buffer that starts after where we left
                # off; a gap in a partly filled buffer is the driver not
                # sampling (it may skip while idle), not a loss
                full = len(samples) >= g.depth.get(stype, float("inf"))
                if last and period and full and stamps[0] - last > 1.5 * period:
                    missed = int((stamps[0] - last) / period) - 1
                    self.counters["buffer_overruns"] += 1
                    start, end = self._to_mono(last), self._to_mono(stamps[0])
                    if start is None:  # not calibrated yet: the read's own time
                        start = end = t0
                    self.sink.loss(
                        "gpu", int(start), int(end), missed, f"gpu{g.index}_{column}_buffer_overrun"
                    )
                g.last_seen_us[stype] = stamps[-1]
                self._obs.append((t0, t1, stamps[-1] * 1000, period * 1000 if period else None))
                for ts, value in fresh:
                    self._pending_buffer.append((g.index, column, ts, sample_value(value, _vtype)))

    def _fit_buffer_poll(self, g, stype):
        """Read the buffer at least twice per its span, so no sample is overwritten."""
        period, depth = g.period_us.get(stype), g.depth.get(stype)
        if period and depth:
            span_s = period * depth / 1e6
            if span_s / 2 < self.buffer_poll_s:
                self.buffer_poll_s = max(span_s / 2, 1.0 / self.poll_hz)

    def _to_mono(self, raw_us):
        if self.sync is None:
            return None
        return raw_us * 1000 - self.sync["offset_ns"]

    def calibrate(self):
        """Fit the driver's sample clock to CLOCK_MONOTONIC from recent reads.

        Each read that returned samples bounds the offset (driver clock minus
        monotonic): the newest sample existed before the call returned
        (offset >= raw - t1) and the one after it did not exist when the call
        began (offset < raw + period - t0). A known clock whose measured
        offset falls inside those bounds is taken as the driver's clock;
        otherwise the bounds' midpoint is used."""
        self._last_sync_ns = now = time.monotonic_ns()
        if not self._obs:
            return self.sync
        lower = max(raw - t1 for t0, t1, raw, p in self._obs)
        uppers = [raw + p - t0 for t0, t1, raw, p in self._obs if p]
        upper = min(uppers) if uppers else None
        slack = max(50_000_000, int(2 * max((p for *_, p in self._obs if p), default=0)))
        best = None
        for name, clock_id in CANDIDATE_CLOCKS:
            offset, err = _clock_offset_ns(clock_id)
            if offset < lower - slack or (upper is not None and offset > upper + slack):
                continue
            mid = lower if upper is None else (lower + upper) // 2
            if best is None or abs(offset - mid) < abs(best[1] - mid):
                best = (name, offset, err)
        if best is not None:
            clock, offset, err = best
        elif upper is not None and upper >= lower:
            clock, offset, err = "envelope", (lower + upper) // 2, (upper - lower + 1) // 2
        else:
            # no period known (or the driver publishes late): never place a
            # sample after the read that returned it
            clock, offset, err = "envelope", lower, None
        # integers throughout: the store's batches must keep one column type
        offset, lower = int(offset), int(lower)
        err = None if err is None else int(err)
        upper = None if upper is None else int(upper)
        self.sync = {
            "clock": clock,
            "offset_ns": offset,
            "err_ns": err,
            "lower_ns": lower,
            "upper_ns": upper,
            "observations": len(self._obs),
        }
        self.counters["syncs"] += 1
        self.sink.append(
            "nvml_clock_sync",
            {
                "ts_ns": [now],
                "clock": [clock],
                "offset_ns": [offset],
                "err_ns": [err],
                "lower_ns": [lower],
                "upper_ns": [upper],
                "observations": [len(self._obs)],
            },
        )
        return self.sync

    def _add_buffer_rows(self, rows, columns):
        """Move calibrated buffer samples into `rows` (column -> list); samples
        wait until the first calibration gives them a CLOCK_MONOTONIC time."""
        if not self._pending_buffer or self.sync is None:
            return
        off, err = self.sync["offset_ns"], self.sync["err_ns"]
        for gpu, column, raw_us, value in self._pending_buffer:
            row = {
                "gpu": gpu,
                "source": "buffer",
                "raw_ts_us": raw_us,
                "ts_ns": raw_us * 1000 - off,
                "sync_err_ns": err,
                column: value,
            }
            if column == "power_mw":
                row["power_source"] = "buffer"
            for c in columns:
                rows[c].append(row.get(c))
        self.counters["buffer_rows"] += len(self._pending_buffer)
        self._pending_buffer.clear()
