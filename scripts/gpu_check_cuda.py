"""The CUDA driver probe against the real libcuda (part of scripts/gpu_check.sh).

Records, on a machine with an NVIDIA driver: the library the process maps,
which probed entry points it exports with which variants (`nm -D` and the
probe's own ELF read), then, where bcc and root allow, attaches the probe
(probes/cuda_bcc.py) to this very process and makes N driver calls through
ctypes (cuInit, a context, N cuMemcpyHtoDAsync_v2 of 4 bytes, N
cuLaunchHostFunc launches, a cuStreamSynchronize, a cuCtxSynchronize), and
checks that the probe counted exactly N of each; the same through a pointer
from cuGetProcAddress_v2 (counted, or documented as missed); and writes the
sync rows beside NVML samples (SM clock) on the same CLOCK_MONOTONIC clock.
Every part that cannot run says why. `--library PATH` runs it against
another library (the tests' fake driver: the GPU-only calls are skipped).
Changes no GPU setting. Prints JSON; `--out FILE` also writes it there.
"""

import argparse
import ctypes as ct
import ctypes.util
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "daemon"))

N = 1000


class ListSink:
    def __init__(self):
        self.rows = []

    def append(self, table, columns):
        if table == "cuda_calls":
            n = len(columns["pid"])
            self.rows += [{k: _py(v[i]) for k, v in columns.items()} for i in range(n)]

    def loss(self, *args):
        self.rows.append({"loss": [str(a) for a in args]})

    def status(self, *args):
        pass


def _py(v):
    try:
        return v.item()
    except AttributeError:
        return v if not hasattr(v, "as_py") else v.as_py()


def find_library(given):
    if given:
        return given
    for path in ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1"):
        if os.path.exists(path):
            return path
    return ctypes.util.find_library("cuda")


def symbols(path):
    from stallscope.probes.cuda_bcc import entry_points, exported_functions

    out = {"path": os.path.realpath(path)}
    try:
        nm = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True)
        names = [line.split()[-1] for line in nm.stdout.splitlines() if " T " in line]
        out["nm_exported_functions"] = len(names)
        out["nm_cu_functions"] = sorted(n for n in names if n.startswith("cu"))
    except OSError as exc:
        out["nm"] = f"not run: {exc}"
    points = entry_points(exported_functions(path))
    out["probed_entry_points"] = {fn: sorted(n for n, f in points.items() if f == fn)
                                  for fn in sorted(set(points.values()))}  # fmt: skip
    return out


def driver_calls(lib, fake):
    """Make N copies and N host-function launches and the syncs; return what was done."""
    done = {"copies": 0, "launches": 0, "syncs": 0}
    stream = ct.c_void_p(0)
    if fake:
        for _ in range(N):
            lib.cuMemcpyHtoDAsync_v2(ct.c_ulonglong(0), None, ct.c_size_t(4), stream)
        done["copies"] = N
        lib.cuStreamSynchronize(stream)
        done["syncs"] = 1
        return done
    assert lib.cuInit(0) == 0, "cuInit failed"
    dev, ctx, dptr = ct.c_int(), ct.c_void_p(), ct.c_ulonglong()
    assert lib.cuDeviceGet(ct.byref(dev), 0) == 0
    assert lib.cuCtxCreate_v2(ct.byref(ctx), 0, dev) == 0
    assert lib.cuMemAlloc_v2(ct.byref(dptr), ct.c_size_t(4)) == 0
    host = (ct.c_char * 4)()
    for _ in range(N):
        assert lib.cuMemcpyHtoDAsync_v2(dptr, host, ct.c_size_t(4), stream) == 0
    done["copies"] = N
    host_fn = ct.CFUNCTYPE(None, ct.c_void_p)(lambda _: None)
    for _ in range(N):
        assert lib.cuLaunchHostFunc(stream, host_fn, None) == 0
    done["launches"] = N
    assert lib.cuStreamSynchronize(stream) == 0
    assert lib.cuCtxSynchronize() == 0
    done["syncs"] = 2
    done["_keep"] = host_fn
    return done


def nvml_samples(seconds=0.5):
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        out, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            out.append(
                [time.monotonic_ns(), pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)]
            )
            time.sleep(0.01)
        return out
    except Exception as exc:
        return f"not run: {type(exc).__name__}: {exc}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", default=None, help="another libcuda (e.g. the tests' fake)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    report = {"part": "cuda driver probe (issue 31)"}
    path = find_library(args.library)
    fake = args.library is not None
    if not path:
        report["result"] = "not run: no libcuda.so.1 found"
        return finish(report, args.out, 0)
    lib = ct.CDLL(path)
    report["library"] = symbols(path)
    from stallscope.probes.cuda_bcc import BccCudaProbe

    reason = BccCudaProbe.unavailable()
    if reason:
        report["probe"] = f"not run: {reason}"
        report["calls_without_probe"] = {k: v for k, v in driver_calls(lib, fake).items()
                                         if not k.startswith("_")}  # fmt: skip
        return finish(report, args.out, 0)
    sink = ListSink()
    probe = BccCudaProbe()
    probe.start(sink)
    try:
        probe.track(os.getpid())
        probe._scan(os.getpid())
        probe.attach()
        report["probe_status"] = probe.status()
        t0 = time.monotonic_ns()
        done = driver_calls(lib, fake)
        # a pointer the driver's own name resolution hands out (cudart, torch)
        pfn = ct.c_void_p()
        rc = lib.cuGetProcAddress_v2(b"cuStreamSynchronize", ct.byref(pfn), 12000, 0, None)
        if rc == 0 and pfn.value:
            ct.CFUNCTYPE(ct.c_int, ct.c_void_p)(pfn.value)(None)
        report["nvml_sm_clock_mhz"] = nvml_samples()
        probe.drain(final=True)
        rows = [r for r in sink.rows if "kind" in r and r["start_ns"] >= t0]
        count = {k: sum(r["count"] for r in rows if r["kind"] == k) for k in ("launch", "copy")}
        report["counted"] = count
        report["made"] = {k: v for k, v in done.items() if not k.startswith("_")}
        report["exact"] = {
            "launches": count["launch"] == done["launches"],
            "copies": count["copy"] == done["copies"],
        }
        report["sync_rows"] = [r for r in rows if r["kind"] in ("sync", "poll")]
        report["cuGetProcAddress_pointer"] = {
            "rc": rc,
            "same_address_as_dlsym": pfn.value
            == ct.cast(lib.cuStreamSynchronize, ct.c_void_p).value,
            # the syncs made directly, plus this one
            "counted": sum(r["count"] for r in rows if r["kind"] == "sync")
            == done["syncs"] + (rc == 0 and bool(pfn.value)),
        }
    finally:
        probe.detach()
        probe.stop()
    ok = all(report["exact"].values())
    return finish(report, args.out, 0 if ok else 1)


def finish(report, out, rc):
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)
    return rc


if __name__ == "__main__":
    sys.exit(main())
