"""Every thread of a live process, read from /proc without stopping it (the hang dump).

For each task of `/proc/PID/task`: the kernel's word on it (run state and
name from `stat`, the wait channel from `wchan`, the system call it is in
from `syscall`, its CPU time) and, for a thread whose PyThreadState its
probe client reported (ingest/pystate.py), its Python stack walked through
`/proc/PID/mem` with the layout the CPU sampler checks
(`BccCpuProbe.check_layout`, probe_client/pyoffsets.py): thread state ->
(cframe ->) current frame -> previous ..., C-stack shim and incomplete
frames skipped, a code pointer whose type is not the code type skipped,
names and lines from the code object (qualname, filename, line table,
cpu_lines.py). `/proc/PID/mem` is read with pread: no ptrace attach, no
signal, the process runs on (`TracerPid` stays 0); the kernel allows it to
a reader that passes its ptrace access check (root or CAP_SYS_PTRACE), with
no attach made. Threads move while they are read: a frame freed
under the walk ends the walk (`mem_fault`), never a crash or a wrong name
(every pointer is checked for its object type). Every byte is untrusted and
bounded. Frames only: never locals, arguments or any other object.
"""

import os
import struct

from probe_client import pyoffsets
from stallscope.probes import bpf_common
from stallscope.probes.cpu_lines import LineTable

_ENC = bpf_common.header_defines("cpu_bcc.h", "PYSTR_")
MAX_FRAMES = 256  # deeper stacks are cut (outermost lost), marked 'truncated'
MAX_STR = 512
MAX_LINETABLE = 64 * 1024
USER_ADDR_MIN = 4096
USER_ADDR_MAX = 1 << 47
# /proc/PID/task/TID/stat run states
STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk sleep",
    "T": "stopped",
    "t": "tracing stop",
    "Z": "zombie",
    "X": "dead",
    "I": "idle",
}


class MemFault(Exception):
    """A read of the process's memory failed (freed, unmapped, gone)."""


class _Mem:
    def __init__(self, pid, proc_root):
        self.fd = os.open(f"{proc_root}/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)

    def close(self):
        os.close(self.fd)

    def read(self, addr, n):
        if not USER_ADDR_MIN <= addr < USER_ADDR_MAX or n <= 0:
            raise MemFault(f"address {addr:#x} is not a user address")
        try:
            data = os.pread(self.fd, n, addr)
        except OSError as exc:
            raise MemFault(str(exc)) from None
        if len(data) != n:
            raise MemFault("short read")
        return data

    def u64(self, addr):
        return struct.unpack("<Q", self.read(addr, 8))[0]

    def i32(self, addr):
        return struct.unpack("<i", self.read(addr, 4))[0]

    def u8(self, addr):
        return self.read(addr, 1)[0]


def _str(mem, f, obj):
    """Text of a str object (compact only, like the sampler), None if not one."""
    if not obj:
        return None
    if mem.u64(obj + f["ob_type"]) != f["str_type"]:
        return None
    length = mem.u64(obj + f["str_length"])
    state = struct.unpack("<I", mem.read(obj + f["str_state"], 4))[0]
    kind = (state >> 2) & 7
    if not (state >> 5) & 1 or length > 1 << 20:
        return None
    if (state >> 6) & 1:
        raw = mem.read(obj + f["str_ascii_data"], min(length, MAX_STR)) if length else b""
        return raw.decode("ascii", "replace") + ("\u2026" if length > MAX_STR else "")
    if kind not in (1, 2, 4):
        return None
    raw = mem.read(obj + f["str_compact_data"], min(length, MAX_STR) * kind)
    codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
    return raw.decode(codec, "replace")


def _bytes(mem, f, obj):
    if not obj or mem.u64(obj + f["ob_type"]) != f["bytes_type"]:
        return None
    n = mem.u64(obj + f["bytes_size"])
    if n > MAX_LINETABLE:
        return None
    return mem.read(obj + f["bytes_data"], n) if n else b""


class _Code:
    __slots__ = ("name", "file", "firstlineno", "lines", "firsttraceable")

    def __init__(self, mem, f, version, code):
        self.name = _str(mem, f, mem.u64(code + f["co_name"])) or "<unknown>"
        self.file = _str(mem, f, mem.u64(code + f["co_filename"]))
        self.firstlineno = mem.i32(code + f["co_firstlineno"])
        table = _bytes(mem, f, mem.u64(code + f["co_linetable"]))
        self.lines = LineTable(version, table or b"", self.firstlineno)
        ft = f["co_firsttraceable"]
        self.firsttraceable = mem.i32(code + ft) if ft >= 0 else None

    def line(self, lasti):
        if lasti < 0:
            return self.firstlineno
        return self.lines.line(lasti * 2)


def python_stack(mem, f, version, tstate, codes):
    """([(file, function, line)] innermost first, None or why the walk stopped)."""
    frame = mem.u64(tstate + f["ts_frame"])
    if f["has_cframe"] and frame:
        frame = mem.u64(frame + f["cframe_frame"])
    out = []
    seen = set()
    while frame:
        if len(out) >= MAX_FRAMES:
            return out, "truncated"
        if frame in seen:
            return out, "loop"
        seen.add(frame)
        try:
            code = mem.u64(frame + f["f_code"])
            back = mem.u64(frame + f["f_back"])
            owner = 0
            if f["frame_kind"] == pyoffsets.FRAME_OBJECT:
                lasti = mem.i32(frame + f["f_instr"])
            else:
                owner = mem.u8(frame + f["f_owner"])
                instr = mem.u64(frame + f["f_instr"])
                lasti = (instr - code - f["co_code_adaptive"]) >> 1 if instr else -1
            frame = back
            if f["owner_cstack"] >= 0 and owner == f["owner_cstack"]:
                continue
            if not code or mem.u64(code + f["ob_type"]) != f["code_type"]:
                continue
            named = codes.get(code)
            if named is None:
                named = codes[code] = _Code(mem, f, version, code)
            if (
                named.firsttraceable is not None
                and owner != pyoffsets.OWNER_GENERATOR
                and lasti < named.firsttraceable
            ):
                continue  # pushed, not started
            out.append((named.file, named.name, named.line(lasti)))
        except MemFault:
            return out, "mem_fault"
    return out, None


def _read(path):
    try:
        with open(path, "rb") as fh:
            return fh.read(4096).decode("utf-8", "replace").strip()
    except OSError:
        return None


def kernel_state(proc_root, pid, tid):
    """{'name', 'state', 'wchan', 'syscall', 'cpu_ns'} of one task (None: gone)."""
    base = f"{proc_root}/{pid}/task/{tid}"
    stat = _read(f"{base}/stat")
    if stat is None:
        return None
    name = stat[stat.find("(") + 1 : stat.rfind(")")]
    rest = stat[stat.rfind(")") + 2 :].split()
    tick = os.sysconf("SC_CLK_TCK")
    cpu_ns = (int(rest[11]) + int(rest[12])) * 1_000_000_000 // tick if len(rest) > 12 else None
    wchan = _read(f"{base}/wchan")
    syscall = _read(f"{base}/syscall")
    nr = None
    if syscall and syscall[0].isdigit():
        nr = int(syscall.split()[0])
    return {
        "name": name,
        "state": rest[0] if rest else "?",
        "wchan": None if wchan in (None, "", "0") else wchan,
        "syscall": nr,
        "cpu_ns": cpu_ns,
    }


def read_threads(pid, proc_root="/proc", layout=None, tstates=None):
    """Every thread of `pid` now: [{'tid', 'name', 'state', 'wchan', 'syscall',
    'cpu_ns', 'frames': [(file, function, line)], 'walk': None or why}],
    plus a sentence of what the dump lacks (None: nothing). `layout` is
    (fields, version) from check_layout, `tstates` {tid: PyThreadState}."""
    try:
        tids = sorted(int(t) for t in os.listdir(f"{proc_root}/{pid}/task"))
    except (OSError, ValueError):
        return [], f"process {pid} is gone"
    lacks = None
    mem = None
    if layout is None or not tstates:
        lacks = "no Python frames: the process's client reported no checked layout"
    else:
        try:
            mem = _Mem(pid, proc_root)
        except OSError as exc:
            lacks = f"no Python frames: /proc/{pid}/mem: {exc.strerror or exc}"
    codes = {}
    out = []
    try:
        for tid in tids:
            ks = kernel_state(proc_root, pid, tid)
            if ks is None:
                continue
            ks["tid"] = tid
            ks["frames"], ks["walk"] = [], None
            tstate = (tstates or {}).get(tid)
            if mem is not None and tstate:
                try:
                    ks["frames"], ks["walk"] = python_stack(
                        mem, layout[0], layout[1], tstate, codes
                    )
                except MemFault:
                    ks["walk"] = "mem_fault"
            out.append(ks)
    finally:
        if mem is not None:
            mem.close()
    return out, lacks


def tracer_pid(pid, proc_root="/proc"):
    """The `TracerPid:` of /proc/PID/status (0: nobody ptraces it), None if gone."""
    text = _read(f"{proc_root}/{pid}/status")
    for line in (text or "").splitlines():
        if line.startswith("TracerPid:"):
            return int(line.split()[1])
    return None
