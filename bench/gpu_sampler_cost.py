"""The GPU sampler's own CPU cost, against the fake NVML (no GPU needed).

What it measures is the Python side only (bindings' marshalling, the probe's
bookkeeping, the fake's answers); the driver's time per call is what
scripts/gpu_check.sh measures on a GPU. Arms, timed in interleaved rounds:

  fake_call     one fake C function called directly (the fake's own share)
  binding_call  nvmlDeviceGetClockInfo through the bindings (+ fake)
  poll_1gpu     probe.poll() with 1 GPU (7 NVML calls and a row)
  poll_8gpu     probe.poll() with 8 GPUs, per GPU
  buffers_1gpu  probe.read_buffers() with 1 GPU, 1 s of 20 ms samples per type

and then the poller thread at 10 Hz on 8 GPUs for --seconds: its own CPU time
(pthread CPU clock) per wall second. Usage:
  python bench/gpu_sampler_cost.py [--rounds R] [--seconds S]
"""

import argparse
import ctypes
import statistics
import time

import pynvml

from stallscope.probes.base import ProbeSettings
from stallscope.probes.gpu_nvml import NvmlGpuProbe
from stallscope.testing import fake_nvml


class NullSink:
    def append(self, table, columns):
        pass

    def loss(self, *args):
        pass

    def status(self, *args):
        pass


def per_call_us(fn, n):
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n / 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()

    fake1 = fake_nvml.FakeNvml(gpus=1)
    fake8 = fake_nvml.FakeNvml(gpus=8)
    fake_nvml.install(fake1)
    p1 = NvmlGpuProbe(ProbeSettings(gpu_buffers=False))
    p1.open(NullSink())
    pb = NvmlGpuProbe(ProbeSettings())
    pb.open(NullSink())
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    raw = object.__getattribute__(fake1, "nvmlDeviceGetClockInfo")
    out = ctypes.c_uint()
    ctype = ctypes.c_uint(1)

    def buffers():
        for g in pb.gpus:  # pretend 1 s passed: 50 new samples per type
            for k in g.last_seen_us:
                g.last_seen_us[k] -= 1_000_000
        pb.read_buffers()
        pb._pending_buffer.clear()

    arms = {
        "fake_call": lambda: raw(h, ctype, ctypes.byref(out)),
        "binding_call": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        "poll_1gpu": p1.poll,
        "buffers_1gpu": buffers,
    }
    n = {"fake_call": 20000, "binding_call": 20000, "poll_1gpu": 2000, "buffers_1gpu": 100}
    res = {k: [] for k in list(arms) + ["poll_8gpu_per_gpu"]}
    for _ in range(args.rounds):
        fake_nvml.install(fake1)
        for k, fn in arms.items():
            res[k].append(per_call_us(fn, n[k]))
            if k == "poll_1gpu":
                p1._rows = {c: [] for c in p1._rows}
        fake_nvml.install(fake8)
        p8 = NvmlGpuProbe(ProbeSettings(gpu_buffers=False))
        p8.open(NullSink())
        res["poll_8gpu_per_gpu"].append(per_call_us(p8.poll, 500) / 8)
    print(f"rounds {args.rounds}; median per call, microseconds (CPU side, fake driver):")
    for k, v in res.items():
        print(f"  {k:20s} {statistics.median(v):9.2f}   (min {min(v):.2f}, max {max(v):.2f})")
    print(
        f"  => NVML calls/s one thread can issue through the bindings: "
        f"{1e6 / statistics.median(res['binding_call']):,.0f}"
    )
    print(f"  => polls/s of one GPU: {1e6 / statistics.median(res['poll_1gpu']):,.0f}")

    fake_nvml.install(fake8)
    probe = NvmlGpuProbe(ProbeSettings(gpu_poll_hz=10))
    probe.start(NullSink())
    clk = time.pthread_getcpuclockid(probe._thread.ident)
    time.sleep(0.5)
    c0, w0, polls0 = time.clock_gettime(clk), time.monotonic(), probe.counters["polls"]
    time.sleep(args.seconds)
    c1, w1, polls1 = time.clock_gettime(clk), time.monotonic(), probe.counters["polls"]
    probe.stop()
    print(
        f"poller thread, 8 GPUs at 10 Hz with buffers, {args.seconds:g} s: "
        f"{(c1 - c0) / (w1 - w0) * 100:.2f}% of one CPU, "
        f"{(polls1 - polls0) / (w1 - w0):.2f} polls/s, late ticks {probe.counters['late_ticks']}"
    )


if __name__ == "__main__":
    main()
