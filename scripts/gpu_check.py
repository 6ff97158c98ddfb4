"""One short run of the GPU probe on a real GPU, printing the figures it needs.

Measures, on GPU 0 (and the probe on every GPU): per-call latency of each
NVML function the probe uses, the driver sample buffers' period and depth,
the calibrated offset of their clock to CLOCK_MONOTONIC and its error, the
sampler's achieved rate (default rate, and flat out), and whether sampling
changes a CUDA matmul loop's step time (torch.cuda only: a CPU stand-in would
say nothing about driver-lock contention, so without torch.cuda that part is
reported as not run). Writes JSON to --out (scripts/gpu_check.sh passes
$OUT/gpu_check.json). `--fake` runs everything against stallscope/testing/fake_nvml
to check the script itself where there is no GPU. It must stay under three
minutes and never change GPU settings (clocks, power limits, persistence).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from itertools import pairwise
from pathlib import Path

from gpu_check_report import report  # scripts/ is this script's own folder

ROOT = Path(__file__).resolve().parent.parent


def import_stallscope():
    """Import the probe from an installed package or the source root daemon/."""
    try:
        import stallscope.probes.gpu_nvml  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "daemon"))
    from stallscope.probes import gpu_nvml
    from stallscope.probes.base import ProbeSettings, Sink

    return gpu_nvml, ProbeSettings, Sink


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else None


def timed(fn, n):
    """Per-call latencies of fn() in microseconds (failures counted, not timed)."""
    out, errors, not_found, last_err = [], 0, 0, None
    for _ in range(n):
        t0 = time.perf_counter_ns()
        try:
            fn()
        except Exception as exc:
            name = type(exc).__name__
            if name != "NVMLError_NotFound":  # "no new sample" is a normal answer: timed
                errors += 1
                last_err = name
                continue
            not_found += 1
        out.append((time.perf_counter_ns() - t0) / 1000)
    return {
        "n": len(out),
        "median_us": statistics.median(out) if out else None,
        "p99_us": pct(out, 0.99),
        "max_us": max(out) if out else None,
        "errors": errors,
        "not_found": not_found,
        "error": last_err,
    }


def call_latencies(nv, h, n):
    newest = {}
    for stype in (5, 0):
        try:
            _, s = nv.nvmlDeviceGetSamples(h, stype, 0)
            newest[stype] = max(int(x.timeStamp) for x in s)
        except nv.NVMLError:
            newest[stype] = 0
    calls = {
        "nvmlDeviceGetClockInfo(SM)": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "nvmlDeviceGetClockInfo(GRAPHICS)": lambda: nv.nvmlDeviceGetClockInfo(
            h, nv.NVML_CLOCK_GRAPHICS
        ),
        "nvmlDeviceGetClockInfo(MEM)": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
        "nvmlDeviceGetFieldValues(POWER_INSTANT)": lambda: nv.nvmlDeviceGetFieldValues(
            h, [nv.NVML_FI_DEV_POWER_INSTANT]
        ),
        "nvmlDeviceGetPowerUsage": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "nvmlDeviceGetTemperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetUtilizationRates": lambda: nv.nvmlDeviceGetUtilizationRates(h),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(
            h
        ),
        "nvmlDeviceGetSamples(PROCESSOR_CLK, newest)": lambda: nv.nvmlDeviceGetSamples(
            h, 5, newest[5]
        ),
        "nvmlDeviceGetSamples(TOTAL_POWER, newest)": lambda: nv.nvmlDeviceGetSamples(
            h, 0, newest[0]
        ),
        "nvmlDeviceGetSamples(PROCESSOR_CLK, all)": lambda: nv.nvmlDeviceGetSamples(h, 5, 0),
    }
    return {name: timed(fn, n) for name, fn in calls.items()}


def buffer_shape(nv, h):
    out = {}
    for stype, label in ((5, "processor_clock"), (0, "total_power")):
        try:
            vtype, samples = nv.nvmlDeviceGetSamples(h, stype, 0)
        except nv.NVMLError as exc:
            out[label] = {"error": str(exc)}
            continue
        read_ns = {
            name: time.clock_gettime_ns(cid)
            for name, cid in (
                ("realtime", time.CLOCK_REALTIME),
                ("boottime", time.CLOCK_BOOTTIME),
                ("monotonic", time.CLOCK_MONOTONIC),
            )
        }
        stamps = sorted(int(s.timeStamp) for s in samples)
        gaps = [b - a for a, b in pairwise(stamps)]
        out[label] = {
            "depth": len(stamps),
            "value_type": int(vtype),
            "period_us_median": statistics.median(gaps) if gaps else None,
            "period_us_min": min(gaps) if gaps else None,
            "period_us_max": max(gaps) if gaps else None,
            "span_s": (stamps[-1] - stamps[0]) / 1e6 if stamps else None,
            "newest_raw_us": stamps[-1] if stamps else None,
            # how far behind each candidate clock the newest sample was when read:
            # the driver's clock is the one with a small positive lag
            "newest_lag_ms": {k: (v - stamps[-1] * 1000) / 1e6 for k, v in read_ns.items()}
            if stamps
            else None,
            "values_first5": [int(s.sampleValue.uiVal) for s in samples[:5]],
        }
    return out


def field_clock(nv, h, n=50):
    """Which clock the field values' timestamps are on (bracketed reads)."""
    lo, hi = None, None
    for _ in range(n):
        t0 = time.monotonic_ns()
        v = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_POWER_INSTANT])[0]
        t1 = time.monotonic_ns()
        if v.nvmlReturn != 0 or v.timestamp <= 0:
            return {"error": f"field return {v.nvmlReturn}"}
        a, b = v.timestamp * 1000 - t1, v.timestamp * 1000 - t0
        lo = a if lo is None else max(lo, a)
        hi = b if hi is None else min(hi, b)
    real = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns()
    boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - time.monotonic_ns()
    return {
        "offset_lower_ns": lo,
        "offset_upper_ns": hi,
        "realtime_minus_mono_ns": real,
        "boottime_minus_mono_ns": boot,
        "matches": [
            name
            for name, off in (("realtime", real), ("boottime", boot), ("monotonic", 0))
            if lo - 2_000_000 <= off <= hi + 2_000_000
        ],
    }


class CountSink:
    def __init__(self):
        self.rows = {}
        self.losses = []
        self.batches = []

    def append(self, table, columns):
        n = len(next(iter(columns.values())))
        self.rows[table] = self.rows.get(table, 0) + n
        if table == "nvml_samples":
            self.batches.append(columns)

    def loss(self, probe, start_ns, end_ns, count, reason):
        self.losses.append((probe, start_ns, end_ns, count, reason))

    def status(self, probe, backend, state, detail):
        self.rows["probe_status"] = self.rows.get("probe_status", 0) + 1


def calibration(gpu_nvml, ProbeSettings, seconds):
    sink = CountSink()
    probe = gpu_nvml.NvmlGpuProbe(ProbeSettings(gpu_sync_s=1e9))
    probe.open(sink)
    t_end = time.monotonic() + seconds
    k = 0
    while time.monotonic() < t_end:
        time.sleep(0.013 + 0.011 * (k % 5))  # uneven spacing: no lock-step with the driver
        probe.read_buffers()
        k += 1
    sync = probe.calibrate()
    probe.flush()
    # compare buffer clock samples with polled SM clock (same domain?)
    probe.poll()
    probe.flush()
    buf = [
        v
        for b in sink.batches
        for v, s in zip(b["sm_clock_mhz"], b["source"], strict=True)
        if s == "buffer" and v is not None
    ]
    pol = [
        v
        for b in sink.batches
        for v, s in zip(b["sm_clock_mhz"], b["source"], strict=True)
        if s == "poll" and v is not None
    ]
    status = probe.status()
    probe.stop()
    return {
        "sync": sync,
        "reads": k,
        "buffer_sm_clock_median_mhz": statistics.median(buf) if buf else None,
        "poll_sm_clock_mhz": pol[-1] if pol else None,
        "buffer_poll_s_chosen": probe.buffer_poll_s,
        "status": {k2: v for k2, v in status.items() if "buffer" in k2},
    }


def poll_rates(gpu_nvml, ProbeSettings, flat_s, default_s):
    sink = CountSink()
    probe = gpu_nvml.NvmlGpuProbe(ProbeSettings(gpu_buffers=False))
    probe.open(sink)
    lat = []
    t_end = time.monotonic() + flat_s
    while time.monotonic() < t_end:
        t0 = time.perf_counter_ns()
        probe.poll()
        lat.append((time.perf_counter_ns() - t0) / 1000)
    probe.flush()
    probe.stop()
    flat = {
        "polls_per_s": len(lat) / flat_s,
        "gpus": len(probe.gpus),
        "poll_all_gpus_median_us": statistics.median(lat),
        "p99_us": pct(lat, 0.99),
    }
    sink = CountSink()
    probe = gpu_nvml.NvmlGpuProbe(ProbeSettings())
    probe.start(sink)
    time.sleep(0.25)
    p0, t0 = probe.counters["polls"], time.monotonic()
    time.sleep(default_s)
    polls = probe.counters["polls"] - p0
    elapsed = time.monotonic() - t0
    late = probe.counters["late_ticks"]
    probe.stop()
    return {
        "flat_out": flat,
        "default": {
            "target_hz": probe.poll_hz,
            "achieved_hz": polls / elapsed,
            "late_ticks": late,
            "rows": sink.rows.get("nvml_samples", 0),
        },
    }


class SamplerProcess:
    """The probe at `hz` in a separate process, as the daemon runs it (no GIL shared)."""

    def __init__(self, hz, fake=False):
        import subprocess

        cmd = [sys.executable, str(Path(__file__).resolve()), "--sampler", str(hz)]
        if fake:
            cmd.append("--fake")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"sampler process did not start: {line!r}")

    def stop(self):
        self.proc.stdin.close()
        out = self.proc.stdout.read()
        self.proc.wait(timeout=30)
        return json.loads(out.strip().splitlines()[-1])


def run_sampler(hz, fake):
    """--sampler mode: run the probe until stdin closes, then print its counters."""
    gpu_nvml, ProbeSettings, _ = import_stallscope()
    if fake:
        from stallscope.testing import fake_nvml

        fake_nvml.install(fake_nvml.FakeNvml(gpus=1))
    probe = gpu_nvml.NvmlGpuProbe(ProbeSettings(gpu_poll_hz=hz))
    sink = CountSink()
    probe.start(sink)
    t0 = time.monotonic()
    print("ready", flush=True)
    sys.stdin.read()
    elapsed = time.monotonic() - t0
    probe.stop()
    print(
        json.dumps(
            {
                "polls": probe.counters["polls"],
                "seconds": elapsed,
                "rows": sink.rows.get("nvml_samples", 0),
                "late_ticks": probe.counters["late_ticks"],
            }
        ),
        flush=True,
    )
    return 0


def matmul_effect(gpu_nvml, block_s, blocks, fake=False):
    try:
        import torch
    except ImportError:
        return {
            "run": False,
            "why": "torch is not installed: matmul check not run (no CPU stand-in)",
        }
    if not torch.cuda.is_available():
        return {"run": False, "why": "torch.cuda is not available: matmul check not run"}
    dev = torch.device("cuda:0")
    big = [torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) for _ in range(2)]
    small = [torch.randn(512, 512, device=dev, dtype=torch.bfloat16) for _ in range(2)]
    loops = {
        # compute-bound: few long kernels
        "big": ("4 x bf16 matmul 8192^3 + synchronize", big, 4),
        # launch-bound, like a serving engine's small decode steps: the
        # driver's locks are on this path
        "small": ("200 x bf16 matmul 512^3 + synchronize", small, 200),
    }

    def steps(a, b, n, seconds):
        out = []
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            t0 = time.perf_counter_ns()
            for _ in range(n):
                torch.matmul(a, b)
            torch.cuda.synchronize()
            out.append((time.perf_counter_ns() - t0) / 1e6)
        return out

    hi = f"on_{gpu_nvml.MAX_POLL_HZ:g}hz"
    res = {
        "run": True,
        "device": torch.cuda.get_device_name(0),
        "block_s": block_s,
        "sampler": "separate process (as the daemon), interleaved blocks",
    }
    for loop, (label, (a, b), n) in loops.items():
        steps(a, b, n, 1.5)  # warm up clocks and cuBLAS
        conditions = {"off": [], "on_10hz": [], hi: []}
        for cond in ["off", "on_10hz", "off", hi] * blocks:
            sampler = None
            if cond != "off":
                sampler = SamplerProcess(10.0 if cond == "on_10hz" else gpu_nvml.MAX_POLL_HZ, fake)
            conditions[cond].extend(steps(a, b, n, block_s))
            if sampler:
                stats = sampler.stop()
                res.setdefault(f"{loop}_sampler_hz_{cond}", []).append(
                    stats["polls"] / stats["seconds"]
                )
        base = statistics.median(conditions["off"])
        res[loop] = {"step": label}
        for cond, vals in conditions.items():
            res[loop][cond] = {
                "steps": len(vals),
                "median_ms": statistics.median(vals),
                "p99_ms": pct(vals, 0.99),
                "max_ms": max(vals),
                "median_vs_off": statistics.median(vals) / base,
                "p99_vs_off": pct(vals, 0.99) / pct(conditions["off"], 0.99),
            }
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fake", action="store_true", help="use stallscope.testing.fake_nvml (no GPU)")
    ap.add_argument("--out", default=None, help="write JSON figures here")
    ap.add_argument("--quick", action="store_true", help="shorter phases (script checks)")
    ap.add_argument("--sampler", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.sampler is not None:
        return run_sampler(args.sampler, args.fake)
    gpu_nvml, ProbeSettings, _ = import_stallscope()
    if args.fake:
        from stallscope.testing import fake_nvml

        fake_nvml.install(fake_nvml.FakeNvml(gpus=1))
    q = 0.2 if args.quick else 1.0
    reason = gpu_nvml.NvmlGpuProbe.unavailable(ProbeSettings())
    if reason:
        print(f"gpu_check: GPU probe unavailable: {reason}")
        return 2
    from stallscope.probes.nvml_bindings import load_bindings

    nv, _ = load_bindings()  # the one module that imports pynvml
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    from importlib import metadata

    res = {
        "host": platform.node(),
        "fake": args.fake,
        "bindings": metadata.version("nvidia-ml-py"),
        "driver": str(nv.nvmlSystemGetDriverVersion()) if not args.fake else "fake",
        "gpu0": str(nv.nvmlDeviceGetName(h)),
        "gpus": nv.nvmlDeviceGetCount(),
    }
    print(
        f"gpu_check: {res['gpu0']} x{res['gpus']}, driver {res['driver']}, "
        f"nvidia-ml-py {res['bindings']}",
        flush=True,
    )
    res["call_latency"] = call_latencies(nv, h, int(300 * q) or 20)
    res["buffers"] = buffer_shape(nv, h)
    res["field_timestamp_clock"] = field_clock(nv, h)
    nv.nvmlShutdown()
    res["calibration"] = calibration(gpu_nvml, ProbeSettings, 5.0 * q)
    res["poll_rate"] = poll_rates(gpu_nvml, ProbeSettings, 3.0 * q, 5.0 * q)
    res["matmul"] = matmul_effect(gpu_nvml, 4.0 * q, 2, args.fake)
    report(res)
    out = args.out or (
        os.path.join(os.environ["OUT"], "gpu_check.json") if os.environ.get("OUT") else None
    )
    if out:
        with open(out, "w") as f:
            json.dump(res, f, indent=2, default=str)
        print(f"gpu_check: figures written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
