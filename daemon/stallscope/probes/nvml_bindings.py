"""The NVML bindings: the one module that imports `pynvml`, and what it needs.

`load_bindings()` imports nvidia-ml-py's `pynvml` and checks that it is the
right package and new enough (`binding_problem` says why not, with the
`pip` command that fixes it); `init_problem` turns an nvmlInit failure into
the operator's message; `sample_value` reads NVML's typed value union. A
missing or wrong binding is a reason the GPU probe is unavailable, never an
error: nothing here raises for it.
"""

import importlib
import os

MIN_BINDINGS = (12, 535)
FIX_BINDINGS = "pip install 'nvidia-ml-py>=12.535'"


def _version_tuple(text):
    parts = []
    for piece in str(text).split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def binding_problem(module, dist_version, dist_file):
    """Why the imported `pynvml` is not usable, with the fix; None if it is.

    `dist_version` is nvidia-ml-py's installed version (None: not installed),
    `dist_file` the pynvml.py that distribution installed (None: unknown)."""
    mod_file = getattr(module, "__file__", "") or ""
    if os.path.basename(mod_file) == "__init__.py":
        # nvidia-ml-py ships a single pynvml.py; a pynvml/ package is the
        # legacy `pynvml` distribution (<= 11.x, returns bytes), which wins
        # the import when both are installed.
        return (
            f"the legacy 'pynvml' package ({os.path.dirname(mod_file)}) shadows "
            f"nvidia-ml-py: pip uninstall -y pynvml && {FIX_BINDINGS}"
        )
    if dist_version is None:
        return (
            f"module pynvml at {mod_file} does not come from nvidia-ml-py: "
            f"pip uninstall -y pynvml && {FIX_BINDINGS}"
        )
    if _version_tuple(dist_version) < MIN_BINDINGS:
        return f"nvidia-ml-py {dist_version} is too old (need >= 12.535): {FIX_BINDINGS}"
    if (
        dist_file
        and mod_file
        and os.path.exists(dist_file)
        and not os.path.samefile(dist_file, mod_file)
    ):
        return (
            f"pynvml is imported from {mod_file}, not from nvidia-ml-py's "
            f"{dist_file}: remove the other copy (pip uninstall -y pynvml)"
        )
    if not hasattr(module, "nvmlDeviceGetCurrentClocksEventReasons"):
        return f"pynvml at {mod_file} lacks nvmlDeviceGetCurrentClocksEventReasons: {FIX_BINDINGS}"
    return None


def load_bindings():
    """(pynvml module or None, problem or None)."""
    try:
        module = importlib.import_module("pynvml")
    except ImportError as exc:
        return None, f"NVML bindings not installed ({exc}): {FIX_BINDINGS}"
    from importlib import metadata

    try:
        version = metadata.version("nvidia-ml-py")
        dist_file = next(
            (
                str(f.locate())
                for f in metadata.files("nvidia-ml-py") or ()
                if f.name == "pynvml.py"
            ),
            None,
        )
    except metadata.PackageNotFoundError:
        version, dist_file = None, None
    problem = binding_problem(module, version, dist_file)
    return (None, problem) if problem else (module, None)


def init_problem(nv, exc):
    """The operator's message for an nvmlInit failure."""
    off = "the GPU probe is off, the daemon runs on"
    if isinstance(exc, nv.NVMLError_LibraryNotFound):
        return f"no NVIDIA driver (libnvidia-ml.so.1 not found); {off}"
    if isinstance(exc, nv.NVMLError_DriverNotLoaded):
        return f"NVIDIA kernel driver not loaded (modprobe nvidia, or check dmesg); {off}"
    if isinstance(exc, nv.NVMLError_NoPermission):
        return f"no permission to open /dev/nvidia* (run as a user in the video group); {off}"
    if isinstance(exc, nv.NVMLError_LibRmVersionMismatch):
        return (
            f"NVML library and kernel driver versions differ (reboot after a driver update); {off}"
        )
    return f"NVML initialisation failed: {exc}; {off}"


def sample_value(value, vtype):
    # value types from nvml.h: 0 double, 1 uint, 2 ulong, 3 ulonglong,
    # 4 slonglong, 5 sint, 6 ushort
    attr = {
        0: "dVal",
        1: "uiVal",
        2: "ulVal",
        3: "ullVal",
        4: "sllVal",
        5: "siVal",
        6: "usVal",
    }.get(int(vtype), "uiVal")
    return int(getattr(value, attr))
