"""GPU probe: samples every GPU's clocks, power and clock-event reasons via NVML.

A poller thread reads, at `settings.gpu_poll_hz` (default 10 Hz), for each
GPU (all, or `settings.gpus`): SM, graphics and memory clocks, board power
(instant through field NVML_FI_DEV_POWER_INSTANT where the driver has it,
else the averaged reading, and which one is recorded), temperature,
utilization and the clock-event-reason bitmask, stamped with CLOCK_MONOTONIC,
into `nvml_samples` (source 'poll'). About once a second it also drains the
driver's own sample buffers (nvmlDeviceGetSamples: processor clock and power),
whose microsecond timestamps are on an undocumented clock; it calibrates that
clock to CLOCK_MONOTONIC (method in docs/gpu-probe.md, results in
`nvml_clock_sync`) and stores them as source 'buffer' with the raw stamp.
A field that fails is NULL and the row is kept; a lost GPU is recorded as a
loss and retried. The bindings are loaded by `nvml_bindings.py` (the only
module that imports `pynvml`), the driver buffers read and calibrated by
`gpu_buffers.py`. It must never poll faster than MAX_POLL_HZ: NVML calls
serialise on driver locks shared with the engine's own GPU threads.
"""

import logging
import threading
import time
from collections import deque

from stallscope import threads
from stallscope.errors import ProbeError
from stallscope.probes.base import Probe, ProbeSettings
from stallscope.probes.gpu_buffers import DriverBuffers, GpuLost, raiser
from stallscope.probes.nvml_bindings import init_problem, load_bindings, sample_value
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

MAX_POLL_HZ = 50.0  # see docs/gpu-probe.md "cost"; faster is refused

# nvml_samples columns this probe writes (daemon/schema/030_gpu.sql has the types)
_COLS = (
    "gpu",
    "ts_ns",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "power_mw",
    "temp_c",
    "util_pct",
    "clock_event_reasons",
    "graphics_clock_mhz",
    "mem_util_pct",
    "power_source",
    "source",
    "raw_ts_us",
    "read_ns",
    "sync_err_ns",
)


class _Gpu:
    """What the probe knows about one device."""

    def __init__(self, index):
        self.index = index
        self.handle = None
        self.name = None
        self.unsupported = set()  # fields the driver said NotSupported for
        self.power_instant = None  # None: not tried yet
        self.reasons_call = "nvmlDeviceGetCurrentClocksEventReasons"
        self.lost_since_ns = None
        self.lost_reason = None
        self.last_retry_ns = 0
        self.last_seen_us = {}  # buffer type -> newest raw timestamp stored
        self.period_us = {}  # buffer type -> median sample spacing
        self.depth = {}  # buffer type -> samples in a full read


class NvmlGpuProbe(DriverBuffers, Probe):
    """NVML poller plus driver-buffer reader for every (or each named) GPU."""

    name = "gpu"
    backend = "nvml"

    def __init__(self, settings=None):
        super().__init__(settings or ProbeSettings())
        hz = float(self.settings.gpu_poll_hz or 10.0)
        if hz > MAX_POLL_HZ:
            log.warning("gpu_poll_hz=%s is above the safe maximum; using %s", hz, MAX_POLL_HZ)
            hz = MAX_POLL_HZ
        self.poll_hz = hz
        self.buffer_poll_s = self.settings.gpu_buffer_poll_s
        self.sync_s = self.settings.gpu_sync_s
        self.batch_s = self.settings.gpu_batch_s
        self.retry_s = self.settings.gpu_retry_s
        self.read_buffers_enabled = self.settings.gpu_buffers
        self.nv = None
        self.sink = None
        self.gpus = []
        self._rows = {c: [] for c in _COLS}
        self._pending_buffer = []  # (gpu, column, raw_us, value) awaiting calibration
        self._obs = deque(maxlen=128)  # (t0_ns, t1_ns, newest_raw_ns, period_ns)
        self.sync = None  # dict: clock, offset_ns, err_ns, lower_ns, upper_ns
        self._stop = threading.Event()
        self._thread = None
        self._lock = threading.Lock()
        self._open = False
        self._last_flush_ns = 0
        self._last_buffer_ns = 0
        self._last_sync_ns = 0
        self.counters = {
            "polls": 0,
            "rows": 0,
            "buffer_rows": 0,
            "field_errors": 0,
            "late_ticks": 0,
            "lost_events": 0,
            "recoveries": 0,
            "buffer_overruns": 0,
            "syncs": 0,
            "tick_errors": 0,
        }

    # ----- availability --------------------------------------------------------
    @classmethod
    def unavailable(cls, settings=None):
        nv, problem = load_bindings()
        if problem:
            return problem
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            return init_problem(nv, exc)
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            return f"NVML cannot count GPUs ({exc}); the GPU probe is off, the daemon runs on"
        finally:
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass
        if count == 0:
            return "NVML sees no GPU; the GPU probe is off, the daemon runs on"
        wanted = tuple((settings or ProbeSettings()).gpus or ())
        missing = [i for i in wanted if not 0 <= int(i) < count]
        if missing:
            return (
                f"GPU index {missing} not present (this host has {count}: 0..{count - 1}); "
                "fix the --gpus setting"
            )
        return None

    # ----- life cycle ----------------------------------------------------------
    def open(self, sink):
        """Initialise NVML, find the GPUs and calibrate; no thread (tests step it)."""
        nv, problem = load_bindings()
        if problem:
            raise ProbeError(problem)
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise ProbeError(init_problem(nv, exc)) from None
        self.nv, self.sink = nv, sink
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            raise ProbeError(
                f"NVML cannot count GPUs ({exc}); the GPU probe is off, the daemon runs on"
            ) from None
        indices = [int(i) for i in (self.settings.gpus or range(count))]
        self.gpus = [_Gpu(i) for i in indices]
        now = time.monotonic_ns()
        for g in self.gpus:
            try:
                self._attach(g)
            except GpuLost as exc:
                self._mark_lost(g, now, str(exc))
        self._open = True
        self._last_flush_ns = now
        if self.read_buffers_enabled:
            self.read_buffers()
            self.calibrate()
        self._status(
            "active",
            f"nvml, {len(self.gpus)} GPU(s) {indices}, "
            f"{self.poll_hz:g} Hz, buffers every {self.buffer_poll_s:g} s",
        )

    def start(self, sink):
        self.open(sink)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-nvml", daemon=True)
        self._thread.start()

    def stop(self):
        if not self._open:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        # a poll stuck inside the driver keeps the lock: give up on it
        # rather than hang the daemon's shutdown
        if not self._lock.acquire(timeout=5.0):
            log.warning("GPU poller stuck in an NVML call; stopping without a final flush")
            self._open = False
            return
        try:
            self.flush()
            self._open = False
            self._status(
                "stopped",
                f"{self.counters['rows']} poll rows, {self.counters['buffer_rows']} buffer rows",
            )
            try:
                self.nv.nvmlShutdown()
            except self.nv.NVMLError:
                pass
        finally:
            self._lock.release()

    def status(self):
        out = {
            "backend": self.backend,
            "poll_hz": self.poll_hz,
            "gpus": [g.index for g in self.gpus],
            "lost": [g.index for g in self.gpus if g.lost_since_ns is not None],
        }
        out.update(self.counters)
        if self.sync:
            out["clock_sync"] = dict(self.sync)
        for g in self.gpus:
            if g.period_us:
                out[f"gpu{g.index}_buffer_period_us"] = dict(g.period_us)
                out[f"gpu{g.index}_buffer_depth"] = dict(g.depth)
        return out

    def _run(self):
        period_ns = int(1e9 / self.poll_hz)
        deadline = time.monotonic_ns()
        state = {"deadline": deadline}
        # Background priority; more than two periods late (the CPU is taken
        # by everything else) raises it until it keeps its rate again.
        threads.background(
            "gpu-poll", backlog=lambda: (time.monotonic_ns() - state["deadline"]) / (4 * period_ns)
        )
        while not self._stop.is_set():
            try:
                with self._lock:
                    self.tick()
            except Exception:  # the poller must survive anything NVML does
                self.counters["tick_errors"] += 1
                if (
                    self.counters["tick_errors"] in (1, 10)
                    or self.counters["tick_errors"] % 1000 == 0
                ):
                    log.exception(
                        "GPU poll failed (%d so far); continuing", self.counters["tick_errors"]
                    )
            deadline += period_ns
            state["deadline"] = deadline
            now = time.monotonic_ns()
            if now > deadline:  # fell behind (load, slow driver): skip, don't burst
                self.counters["late_ticks"] += (now - deadline) // period_ns + 1
                deadline = now + period_ns - (now - deadline) % period_ns
            self._stop.wait((deadline - now) / 1e9)

    def tick(self):
        """One poll of every GPU, plus buffers, calibration and flush when due."""
        self.poll()
        now = time.monotonic_ns()
        if self.read_buffers_enabled and now - self._last_buffer_ns >= self.buffer_poll_s * 1e9:
            self.read_buffers()
        # recalibrate after 0.5, 1, 2, 4 ... s, then every sync_s: the first
        # seconds' reads narrow the envelope quickly
        sync_every_s = min(self.sync_s, 0.5 * 2 ** self.counters["syncs"])
        if self.read_buffers_enabled and now - self._last_sync_ns >= sync_every_s * 1e9:
            self.calibrate()
        if now - self._last_flush_ns >= self.batch_s * 1e9:
            self.flush()

    # ----- devices ---------------------------------------------------------------
    def _call(self, g, field, fn, *args):
        """fn(*args), or None when the field fails; GpuLost when the GPU is gone."""
        if field in g.unsupported:
            return None
        nv = self.nv
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            if isinstance(
                exc,
                (
                    nv.NVMLError_GpuIsLost,
                    nv.NVMLError_ResetRequired,
                    nv.NVMLError_Uninitialized,
                    nv.NVMLError_DriverNotLoaded,
                ),
            ):
                raise GpuLost(f"{field}: {exc}") from None
            if isinstance(exc, nv.NVMLError_NotSupported):
                g.unsupported.add(field)
            else:
                self.counters["field_errors"] += 1
            return None

    def _attach(self, g):
        nv = self.nv
        try:
            g.handle = nv.nvmlDeviceGetHandleByIndex(g.index)
        except nv.NVMLError as exc:
            raise GpuLost(f"handle: {exc}") from None
        g.name = self._call(g, "name", nv.nvmlDeviceGetName, g.handle)
        g.unsupported.clear()
        g.power_instant = None

    def _mark_lost(self, g, now_ns, reason):
        g.lost_since_ns, g.lost_reason, g.last_retry_ns = now_ns, reason, now_ns
        self.counters["lost_events"] += 1
        self._status(
            "failed",
            f"GPU {g.index} ({g.name or '?'}) lost ({reason}); retrying every "
            f"{self.retry_s:g} s; if it persists the GPU needs a reset "
            "(nvidia-smi -r) or the host a reboot",
        )

    def _retry(self, g, now_ns):
        g.last_retry_ns = now_ns
        nv = self.nv
        try:
            nv.nvmlInit()  # refcounted; re-creates state after a driver reload
            try:
                self._attach(g)
                nv.nvmlDeviceGetClockInfo(g.handle, nv.NVML_CLOCK_SM)
            finally:
                nv.nvmlShutdown()
        except (nv.NVMLError, GpuLost):
            return False
        gap_polls = max(1, round((now_ns - g.lost_since_ns) * self.poll_hz / 1e9))
        self.sink.loss(
            "gpu", g.lost_since_ns, now_ns, gap_polls, f"gpu{g.index}_lost: {g.lost_reason}"
        )
        self.counters["recoveries"] += 1
        self._status(
            "active", f"GPU {g.index} answers again after {(now_ns - g.lost_since_ns) / 1e9:.1f} s"
        )
        g.lost_since_ns = g.lost_reason = None
        g.last_seen_us.clear()
        return True

    # ----- polling -----------------------------------------------------------------
    def poll(self):
        """Read every GPU once and queue one 'poll' row each."""
        self.counters["polls"] += 1
        for g in self.gpus:
            now = time.monotonic_ns()
            if g.lost_since_ns is not None:
                if now - g.last_retry_ns < self.retry_s * 1e9 or not self._retry(g, now):
                    continue
            try:
                row = self._read(g)
            except GpuLost as exc:
                self._mark_lost(g, now, str(exc))
                continue
            for c in _COLS:
                self._rows[c].append(row.get(c))
            self.counters["rows"] += 1

    def _read(self, g):
        nv, h, call = self.nv, g.handle, self._call
        t0 = time.monotonic_ns()
        row = {"gpu": g.index, "source": "poll"}
        row["sm_clock_mhz"] = call(g, "sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        row["graphics_clock_mhz"] = call(
            g, "graphics_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_GRAPHICS
        )
        row["mem_clock_mhz"] = call(g, "mem_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        self._read_power(g, row)
        row["temp_c"] = call(g, "temp", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        util = call(g, "util", nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            row["util_pct"], row["mem_util_pct"] = int(util.gpu), int(util.memory)
        row["clock_event_reasons"] = self._read_reasons(g)
        t1 = time.monotonic_ns()
        row["ts_ns"], row["read_ns"] = (t0 + t1) // 2, t1 - t0
        return row

    def _read_power(self, g, row):
        nv = self.nv
        if g.power_instant is not False:
            values = self._call(
                g,
                "power_instant",
                nv.nvmlDeviceGetFieldValues,
                g.handle,
                [nv.NVML_FI_DEV_POWER_INSTANT],
            )
            if values is not None:
                v = values[0]
                if v.nvmlReturn == nv.NVML_SUCCESS:
                    g.power_instant = True
                    row["power_mw"] = _field_value(nv, v)
                    row["power_source"] = "instant"
                    row["raw_ts_us"] = int(v.timestamp) if v.timestamp > 0 else None
                    return
                if v.nvmlReturn in (nv.NVML_ERROR_GPU_IS_LOST, nv.NVML_ERROR_RESET_REQUIRED):
                    raise GpuLost(f"power_instant: {nv.NVMLError(v.nvmlReturn)}")
                if v.nvmlReturn == nv.NVML_ERROR_NOT_SUPPORTED:
                    g.power_instant = False
                else:
                    self.counters["field_errors"] += 1
            elif "power_instant" in g.unsupported:
                g.power_instant = False
        power = self._call(g, "power_average", nv.nvmlDeviceGetPowerUsage, g.handle)
        if power is not None:
            row["power_mw"], row["power_source"] = int(power), "average"

    def _read_reasons(self, g):
        nv = self.nv
        if "reasons" in g.unsupported:
            return None
        if g.reasons_call == "nvmlDeviceGetCurrentClocksEventReasons":
            try:
                return nv.nvmlDeviceGetCurrentClocksEventReasons(g.handle)
            except nv.NVMLError_FunctionNotFound:
                # drivers older than 535 only have the throttle-reasons call
                g.reasons_call = "nvmlDeviceGetCurrentClocksThrottleReasons"
            except nv.NVMLError as exc:
                return self._call(g, "reasons", raiser(exc))
        return self._call(g, "reasons", nv.nvmlDeviceGetCurrentClocksThrottleReasons, g.handle)

    # ----- output ---------------------------------------------------------------------
    def flush(self):
        """Hand everything queued to the sink as one batch."""
        self._last_flush_ns = time.monotonic_ns()
        self._add_buffer_rows(self._rows, _COLS)
        if not self._rows["gpu"]:
            return
        # plain lists (the store makes Arrow of them; all-NULL columns are
        # cast by INSERT ... BY NAME), so this module needs nothing but pynvml
        batch, self._rows = self._rows, {c: [] for c in _COLS}
        self.sink.append("nvml_samples", batch)

    def _status(self, state, detail):
        if self.sink is None:
            return
        log.info("gpu probe %s: %s", state, detail)
        self.sink.status(self.name, self.backend, state, detail)


def _field_value(nv, v):
    """A c_nvmlFieldValue_t's value as an int, by its declared type."""
    return sample_value(v.value, v.valueType)
