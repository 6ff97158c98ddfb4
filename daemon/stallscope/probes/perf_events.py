"""The perf_event_open ABI the perf scheduling backend needs, and nothing else.

The `perf_event_attr` struct, the syscall (there is no libc wrapper), the
two ioctls, tracepoint ids and field offsets read from tracefs, the online
CPUs, and one CPU's mmapped ring buffer (`Ring.read` hands over the bytes
between the kernel's head and our tail). Errors are the kernel's, as
OSError with its errno; this module keeps no state and opens nothing it does
not return.
"""

import ctypes as ct
import mmap
import os
import struct
import time

TRACEFS = "/sys/kernel/tracing"
NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(os.uname().machine, 298)

PERF_TYPE_SOFTWARE = 1
PERF_TYPE_TRACEPOINT = 2
PERF_COUNT_SW_CPU_CLOCK = 0
PERF_COUNT_SW_CPU_MIGRATIONS = 4
PERF_COUNT_SW_DUMMY = 9
PERF_SAMPLE_TID = 1 << 1
PERF_SAMPLE_TIME = 1 << 2
PERF_SAMPLE_CPU = 1 << 7
PERF_SAMPLE_RAW = 1 << 10
PERF_FLAG_FD_CLOEXEC = 1 << 3
# attr flag bits
SAMPLE_ID_ALL = 1 << 18
USE_CLOCKID = 1 << 25
CONTEXT_SWITCH = 1 << 26
CLOCK_MONOTONIC = 1

PERF_RECORD_LOST = 2
PERF_RECORD_SAMPLE = 9
PERF_RECORD_SWITCH = 14
PERF_RECORD_MISC_SWITCH_OUT = 1 << 13
PERF_RECORD_MISC_SWITCH_OUT_PREEMPT = 1 << 14

PERF_EVENT_IOC_SET_OUTPUT = 0x2405
PERF_EVENT_IOC_SET_FILTER = 0x40082406


class PerfEventAttr(ct.Structure):
    _fields_ = [
        ("type", ct.c_uint32),
        ("size", ct.c_uint32),
        ("config", ct.c_uint64),
        ("sample_period", ct.c_uint64),
        ("sample_type", ct.c_uint64),
        ("read_format", ct.c_uint64),
        ("flags", ct.c_uint64),
        ("wakeup_events", ct.c_uint32),
        ("bp_type", ct.c_uint32),
        ("config1", ct.c_uint64),
        ("config2", ct.c_uint64),
        ("branch_sample_type", ct.c_uint64),
        ("sample_regs_user", ct.c_uint64),
        ("sample_stack_user", ct.c_uint32),
        ("clockid", ct.c_int32),
        ("sample_regs_intr", ct.c_uint64),
        ("aux_watermark", ct.c_uint32),
        ("sample_max_stack", ct.c_uint16),
        ("reserved_2", ct.c_uint16),
        ("aux_sample_size", ct.c_uint32),
        ("reserved_3", ct.c_uint32),
        ("sig_data", ct.c_uint64),
    ]


_libc = ct.CDLL(None, use_errno=True)
_libc.syscall.restype = ct.c_long


def perf_event_open(attr, pid, cpu, group_fd=-1, flags=PERF_FLAG_FD_CLOEXEC):
    attr.size = ct.sizeof(PerfEventAttr)
    fd = _libc.syscall(NR_PERF_EVENT_OPEN, ct.byref(attr), pid, cpu, group_fd, flags)
    if fd < 0:
        err = ct.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def cpu_clock_attr(period_ns):
    """A cpu-clock event's attributes (the CPU sampler's clock), sampling every
    `period_ns` of CPU time, opened disabled."""
    attr = PerfEventAttr()
    attr.type = PERF_TYPE_SOFTWARE
    attr.config = PERF_COUNT_SW_CPU_CLOCK
    attr.sample_period = max(1, int(period_ns))
    attr.flags = 1  # disabled
    return attr


def ioctl(fd, request, arg):
    if _libc.ioctl(fd, ct.c_ulong(request), arg) < 0:
        err = ct.get_errno()
        raise OSError(err, os.strerror(err))


def tracepoint(name):
    """(id, {field: (offset, size)}) of a tracepoint, from its tracefs format file."""
    path = f"{TRACEFS}/events/sched/{name}"
    with open(f"{path}/id") as f:
        tp_id = int(f.read())
    fields = {}
    with open(f"{path}/format") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("field:"):
                continue
            parts = dict(p.strip().split(":", 1) for p in line.split(";") if ":" in p)
            fname = parts["field"].split()[-1].split("[")[0]
            fields[fname] = (int(parts["offset"]), int(parts["size"]))
    return tp_id, fields


def tracepoints_deliver():
    """Count sched_switch for this thread across a few sleeps: 0 means suppressed.

    perf_trace_run_bpf_submit() drops a tracepoint's perf events whenever
    BPF programs attached to it return 0, so another tracer can silence
    this backend without any error."""
    try:
        tp_id, _ = tracepoint("sched_switch")
        fd = perf_event_open(PerfEventAttr(type=PERF_TYPE_TRACEPOINT, config=tp_id), 0, -1)
    except OSError:
        return False
    try:
        for _ in range(3):
            time.sleep(0.001)
        return struct.unpack("<Q", os.read(fd, 8))[0] > 0
    finally:
        os.close(fd)


def online_cpus():
    """CPU numbers from /sys/devices/system/cpu/online ("0-3,6")."""
    try:
        with open("/sys/devices/system/cpu/online") as f:
            text = f.read().strip()
    except OSError:
        return list(range(os.cpu_count()))
    cpus = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


class Ring:
    """One CPU's mmapped perf ring (all events of that CPU write here)."""

    def __init__(self, fd, data_pages):
        self.fd = fd
        self.page = mmap.PAGESIZE
        self.size = data_pages * self.page
        self.map = mmap.mmap(
            fd, self.page + self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
        )

    def read(self):
        """All bytes between data_tail and data_head; advances data_tail."""
        head = struct.unpack_from("<Q", self.map, 1024)[0]
        tail = struct.unpack_from("<Q", self.map, 1032)[0]
        if head == tail:
            return b""
        start = self.page + tail % self.size
        n = head - tail
        end = start + n
        if end <= self.page + self.size:
            data = bytes(self.map[start:end])
        else:
            first = self.page + self.size - start
            data = bytes(self.map[start:]) + bytes(self.map[self.page : self.page + n - first])
        struct.pack_into("<Q", self.map, 1032, head)
        return data

    def close(self):
        self.map.close()
        os.close(self.fd)
