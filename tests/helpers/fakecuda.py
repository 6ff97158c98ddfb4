"""The fake CUDA driver of the tests: built from tests/cuda/fake_libcuda.c with cc.

`build(folder)` compiles it into `folder/libcuda.so.1` (the real driver's
file name, so the probe finds it exactly as it finds the real one) and
returns the path; `require_cc()` skips (or fails in CI) without a compiler.
`FakeCuda(path)` loads it with ctypes and names its calls. Nothing here
needs root.
"""

import ctypes as ct
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "cuda" / "fake_libcuda.c"
NAME = "libcuda.so.1"
# identical functions kept apart (no folding), no tail calls into each other
CFLAGS = ["-O2", "-fPIC", "-shared", "-fno-ipa-icf", "-fno-optimize-sibling-calls", "-Wall"]

LAUNCHES = ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx",
            "cuLaunchKernelEx_ptsz", "cuGraphLaunch", "cuGraphLaunch_ptsz",
            "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz")  # fmt: skip
SYNCS = ("cuStreamSynchronize", "cuStreamSynchronize_ptsz", "cuEventSynchronize",
         "cuCtxSynchronize")  # fmt: skip
QUERIES = ("cuStreamQuery", "cuStreamQuery_ptsz", "cuEventQuery")
COPIES = ("cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds", "cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds",
          "cuMemcpyDtoD_v2", "cuMemcpyDtoD_v2_ptds", "cuMemcpy", "cuMemcpy_ptds",
          "cuMemcpyAsync", "cuMemcpyAsync_ptsz", "cuMemcpyHtoDAsync_v2",
          "cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz")  # fmt: skip


def require_cc():
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler (cc) to build the fake libcuda")


def build(folder):
    """Compile the fake driver into `folder`/libcuda.so.1 (once per folder)."""
    out = Path(folder) / NAME
    if not out.exists():
        subprocess.run(["cc", *CFLAGS, "-o", str(out), str(SOURCE), "-ldl"], check=True)
    return out


class FakeCuda:
    """The fake driver loaded into this process (ctypes)."""

    def __init__(self, path):
        self.lib = ct.CDLL(str(path))
        for name in ("fake_set_launch_ns", "fake_set_copy_ns", "fake_busy_for"):
            getattr(self.lib, name).argtypes = [ct.c_longlong]
        self.lib.fake_launches.restype = ct.c_longlong
        self.lib.fake_busy_until.restype = ct.c_longlong
        self.lib.cuLaunchKernel.argtypes = [ct.c_void_p] + [ct.c_uint] * 7 + [ct.c_void_p] * 3
        self.lib.cuMemcpyHtoD_v2.argtypes = [ct.c_ulonglong, ct.c_void_p, ct.c_size_t]

    def launch(self, n=1, name="cuLaunchKernel"):
        fn = getattr(self.lib, name)
        if name.startswith("cuLaunchKernel") and "Ex" not in name:
            for _ in range(n):
                fn(None, 1, 1, 1, 1, 1, 1, 0, None, None, None)
        else:
            for _ in range(n):
                fn(None, None)

    def busy_for(self, ns):
        self.lib.fake_busy_for(int(ns))

    def sync(self, name="cuStreamSynchronize", sleeps=False):
        self.lib.fake_set_sync_sleeps(1 if sleeps else 0)
        fn = getattr(self.lib, name)
        return fn() if name == "cuCtxSynchronize" else fn(None)

    def poll(self, name="cuEventQuery"):
        """Poll until the GPU is idle, as engines that spin on an event do."""
        fn = getattr(self.lib, name)
        polls = 1
        while fn(None) == 600:
            polls += 1
        return polls

    def copy(self, name="cuMemcpyHtoD_v2"):
        getattr(self.lib, name)(0, None, 0) if "Async" not in name else getattr(self.lib, name)(
            0, None, 0, None
        )

    def proc_address(self, symbol):
        """What cuGetProcAddress hands cudart and torch for `symbol`."""
        pfn = ct.c_void_p()
        rc = self.lib.cuGetProcAddress(symbol.encode(), ct.byref(pfn), 12000, 0)
        return pfn.value if rc == 0 else None
