"""A fake libnvidia-ml.so.1 that answers like an H200, at the C-call level.

`install(fake)` puts it where nvidia-ml-py keeps its library handle
(`pynvml.nvmlLib`), so the bindings' real code runs: argument marshalling,
return-code checks, error classes, struct decoding. Each method is named
like the C symbol and receives the same ctypes arguments the real library
would; outputs are written through the byref()/array arguments. The tests,
bench/gpu_sampler_cost.py and `scripts/gpu_check.py --fake` share it (so it
lives in the package, not under tests/); the daemon never imports it, and it
imports nothing else from stallscope.
"""

import ctypes
import threading
import time

import pynvml

SUCCESS, NOT_SUPPORTED, NOT_FOUND, GPU_IS_LOST = 0, 3, 6, 15


def _out(arg):
    """The ctypes object behind a byref() argument (or the object itself)."""
    return getattr(arg, "_obj", arg)


class FakeGpu:
    """One device's state; tests change these fields between polls."""

    def __init__(self, index):
        self.index = index
        self.name = b"NVIDIA H200"
        self.sm_mhz = 1980
        self.graphics_mhz = 1980
        self.mem_mhz = 3201
        self.power_instant_mw = 612_000
        self.power_average_mw = 598_000
        self.temp_c = 47
        self.util = (98, 61)
        self.reasons = 0x0
        self.unsupported = set()  # C symbols answering NOT_SUPPORTED
        self.instant_supported = True  # field 186 per-value return code
        self.lost = False
        self.empty_buffers = False  # nvmlDeviceGetSamples -> NOT_FOUND
        self.struct = pynvml.struct_c_nvmlDevice_t()


class FakeNvml:
    """The function table. `driver_clock_us()` is the clock of sample stamps."""

    def __init__(self, gpus=1, period_us=20_000, depth=100, driver_clock_us=None):
        self.gpus = [FakeGpu(i) for i in range(gpus)]
        self.period_us = period_us
        self.depth = depth
        self.driver_clock_us = driver_clock_us or (
            lambda: time.clock_gettime_ns(time.CLOCK_REALTIME) // 1000
        )
        # (start_us, end_us, sm_mhz) on the driver clock: the buffer's clock history
        self.clock_episodes = []
        # (start_us, end_us) on the driver clock where the driver took no sample
        self.sample_gaps = []
        self.calls = {}
        self.missing = set()  # C symbols this "driver" does not export
        self._lock = threading.Lock()

    def __getattribute__(self, name):
        if name.startswith("nvml"):
            if name in object.__getattribute__(self, "missing"):
                raise AttributeError(name)
            fn = object.__getattribute__(self, name)
            calls = object.__getattribute__(self, "calls")

            def counted(*args):
                # the bindings cache this wrapper, so it counts every C call
                calls[name] = calls.get(name, 0) + 1
                return fn(*args)

            return counted
        return object.__getattribute__(self, name)

    # ----- helpers ------------------------------------------------------------------
    def _gpu(self, handle):
        addr = ctypes.addressof(handle.contents)
        for g in self.gpus:
            if ctypes.addressof(g.struct) == addr:
                return g
        raise AssertionError("unknown handle")

    def _check(self, handle, symbol):
        g = self._gpu(handle)
        if g.lost:
            return g, GPU_IS_LOST
        if symbol in g.unsupported:
            return g, NOT_SUPPORTED
        return g, SUCCESS

    def sm_at(self, g, t_us):
        for start, end, mhz in self.clock_episodes:
            if start <= t_us < end:
                return mhz
        return g.sm_mhz

    # ----- library --------------------------------------------------------------------
    def nvmlInitWithFlags(self, flags):
        return SUCCESS

    def nvmlShutdown(self):
        return SUCCESS

    def nvmlDeviceGetCount_v2(self, count):
        _out(count).value = len(self.gpus)
        return SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index, device):
        i = _out(index).value if hasattr(_out(index), "value") else int(index)
        if not 0 <= i < len(self.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if self.gpus[i].lost:
            return GPU_IS_LOST
        _out(device).contents = self.gpus[i].struct
        return SUCCESS

    def nvmlDeviceGetName(self, handle, buf, size):
        g, rc = self._check(handle, "nvmlDeviceGetName")
        if rc == SUCCESS:
            buf.value = g.name
        return rc

    def nvmlDeviceGetClockInfo(self, handle, ctype, out):
        g, rc = self._check(handle, "nvmlDeviceGetClockInfo")
        if rc == SUCCESS:
            _out(out).value = {0: g.graphics_mhz, 1: g.sm_mhz, 2: g.mem_mhz}[ctype.value]
        return rc

    def nvmlDeviceGetPowerUsage(self, handle, out):
        g, rc = self._check(handle, "nvmlDeviceGetPowerUsage")
        if rc == SUCCESS:
            _out(out).value = g.power_average_mw
        return rc

    def nvmlDeviceGetFieldValues(self, handle, count, values):
        g, rc = self._check(handle, "nvmlDeviceGetFieldValues")
        if rc != SUCCESS:
            return rc
        arr = _out(values)
        for i in range(count.value):
            v = arr[i]
            v.timestamp = self.driver_clock_us()
            if v.fieldId == pynvml.NVML_FI_DEV_POWER_INSTANT and g.instant_supported:
                v.nvmlReturn = SUCCESS
                v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                v.value.uiVal = g.power_instant_mw
            else:
                v.nvmlReturn = NOT_SUPPORTED
        return SUCCESS

    def nvmlDeviceGetTemperature(self, handle, sensor, out):
        g, rc = self._check(handle, "nvmlDeviceGetTemperature")
        if rc == SUCCESS:
            _out(out).value = g.temp_c
        return rc

    def nvmlDeviceGetUtilizationRates(self, handle, out):
        g, rc = self._check(handle, "nvmlDeviceGetUtilizationRates")
        if rc == SUCCESS:
            _out(out).gpu, _out(out).memory = g.util
        return rc

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle, out):
        g, rc = self._check(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        if rc == SUCCESS:
            _out(out).value = g.reasons
        return rc

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle, out):
        g, rc = self._check(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")
        if rc == SUCCESS:
            _out(out).value = g.reasons
        return rc

    def nvmlDeviceGetSamples(self, handle, stype, last_us, vtype, count, samples):
        g, rc = self._check(handle, "nvmlDeviceGetSamples")
        if rc != SUCCESS:
            return rc
        if g.empty_buffers:
            return NOT_FOUND
        now_us = self.driver_clock_us()
        newest = now_us - now_us % self.period_us
        stamps = [newest - k * self.period_us for k in range(self.depth)][::-1]
        stamps = [
            t
            for t in stamps
            if t > last_us.value and not any(a <= t < b for a, b in self.sample_gaps)
        ]
        if not stamps:
            return NOT_FOUND
        _out(vtype).value = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        if samples is None:
            _out(count).value = len(stamps)
            return SUCCESS
        n = min(len(stamps), _out(count).value)
        for i, t in enumerate(stamps[:n]):
            samples[i].timeStamp = t
            samples[i].sampleValue.uiVal = (
                self.sm_at(g, t) if stype.value == 5 else g.power_instant_mw
            )
        _out(count).value = n
        return SUCCESS


def install(fake):
    """Make the bindings use `fake` as libnvidia-ml.so.1; returns an undo function."""
    saved = pynvml.nvmlLib
    pynvml.nvmlLib = fake
    pynvml._nvmlGetFunctionPointer_cache.clear()

    def undo():
        pynvml.nvmlLib = saved
        pynvml._nvmlGetFunctionPointer_cache.clear()

    return undo
