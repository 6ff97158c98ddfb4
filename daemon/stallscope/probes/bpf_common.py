"""What every bcc probe shares: privileges, record layouts, the ring reader, counters.

Record layouts have one source, the C header next to each program: this
module takes a struct's numpy dtype from the compiled program itself (bcc
describes every map's value type, so a one-entry `layout_*` array map of the
record type gives sizeof and every offsetof as the compiler laid them out),
and `require_fields` turns a field the Python side reads but the header lacks
into a load-time error. Loss counters are a struct in a one-entry mmapped
array, read by field name, so no index is copied either. The ring reader
drains a BPF ring buffer through its mmapped pages in batches (one numpy
slice per drain, never a Python call per event). Nothing here reads a
`task_struct` field or compiles C assembled from strings.
"""

import mmap
import os
import struct
import threading

import numpy as np

TRACEFS = "/sys/kernel/tracing"
PAGE_SIZE = mmap.PAGESIZE
PROBES_DIR = os.path.dirname(os.path.abspath(__file__))
RINGBUF_BUSY_BIT = 1 << 31
RINGBUF_DISCARD_BIT = 1 << 30
RINGBUF_HDR = [("hdr_len", "<u4"), ("hdr_pgoff", "<u4")]

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39


class LayoutError(RuntimeError):
    """The compiled record layout and the Python reader disagree."""


def _effective_caps():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def has_bpf_privileges():
    caps = _effective_caps()
    if os.geteuid() == 0 and caps & (1 << CAP_SYS_ADMIN):
        return True
    return bool(caps & (1 << CAP_BPF)) and bool(caps & (1 << CAP_PERFMON))


def bcc_unavailable(tracepoints, tracefs=TRACEFS, privileged=None):
    """None when bcc can load a program on `tracepoints` ("cat:event") here,
    else the first missing piece and how to fix it. With `tracefs=None`
    (a program on perf events only) tracefs is not needed."""
    if not (has_bpf_privileges() if privileged is None else privileged):
        return (
            "needs root or CAP_BPF+CAP_PERFMON (plus CAP_DAC_READ_SEARCH "
            "for tracefs): run the daemon as root or grant them in its unit"
        )
    try:
        import bcc  # noqa: F401
    except ImportError:
        return (
            "bcc not installed: apt-get install python3-bpfcc, then "
            "scripts/bootstrap.sh links it into the venv"
        )
    if tracefs is not None and not os.path.isdir(f"{tracefs}/events"):
        if os.path.isdir(tracefs) and not os.access(tracefs, os.R_OK | os.X_OK):
            return (
                f"tracefs at {tracefs} is not readable by this user: needs "
                "CAP_DAC_READ_SEARCH (or root)"
            )
        return f"tracefs not mounted at {tracefs}: mount -t tracefs tracefs {tracefs}"
    for tp in tracepoints:
        category, _, event = tp.partition(":")
        if not os.path.exists(f"{tracefs}/events/{category}/{event}/format"):
            return f"kernel lacks the {tp} tracepoint (not in {tracefs}/events)"
    release = os.uname().release
    if not os.path.exists(f"/lib/modules/{release}/build/include"):
        return (
            f"kernel headers missing: apt-get install linux-headers-{release} "
            f"(or scripts/bootstrap.sh links the nearest headers as "
            f"/lib/modules/{release}/build)"
        )
    return None


def compile_program(source, cflags=()):
    """Compile and load `source` (a .c file in this folder) with `cflags`;
    its folder is on the include path so it can include its layout header."""
    from bcc import BPF

    path = os.path.join(PROBES_DIR, source)
    flags = [f"-I{PROBES_DIR}", *cflags]
    return BPF(src_file=path.encode(), cflags=flags)


# ----- layouts -------------------------------------------------------------------


def header_defines(header, prefix):
    """{NAME: int} of `#define PREFIX... <integer>` lines in a header here."""
    import re

    with open(os.path.join(PROBES_DIR, header)) as f:
        text = f.read()
    pattern = rf"^#define\s+({re.escape(prefix)}\w*)\s+(0x[0-9a-fA-F]+|\d+)\b"
    return {m[1]: int(m[2], 0) for m in re.finditer(pattern, text, re.M)}


def struct_dtype(ctype):
    """The numpy dtype of a bcc ctypes struct, at the compiler's offsets.

    char arrays become bytes fields ('S16'), padding fields that bcc names
    `__pad_*` are left out (the offsets keep the holes). Nested structs
    become structured fields and other arrays subarrays (an array of
    structs, a u8 array as raw bytes), so a record holding
    `struct frame frames[64]` reads as `rec["frames"]["code"]`."""
    import ctypes as ct

    names, formats, offsets = [], [], []
    for field in ctype._fields_:
        name, ftype = field[0], field[1]
        if name.startswith("__pad"):
            continue
        names.append(name)
        formats.append(_field_dtype(ftype))
        offsets.append(getattr(ctype, name).offset)
    return np.dtype(
        {"names": names, "formats": formats, "offsets": offsets, "itemsize": ct.sizeof(ctype)}
    )


def _field_dtype(ftype):
    import ctypes as ct

    if isinstance(ftype, type) and issubclass(ftype, ct.Structure):
        return struct_dtype(ftype)
    if isinstance(ftype, type) and issubclass(ftype, ct.Array):
        if ftype._type_ is ct.c_char:
            return np.dtype(f"S{ftype._length_}")
        return np.dtype((_field_dtype(ftype._type_), (ftype._length_,)))
    return np.dtype(ftype)


def map_value_dtype(bpf, map_name):
    """dtype of the value type of map `map_name` (e.g. a `layout_*` array)."""
    return struct_dtype(bpf[map_name.encode()].Leaf)


def ring_record_dtype(record):
    """`record` preceded by the ring buffer's 8-byte header, padded to the
    8-byte alignment every ring record has."""
    size = 8 + ((record.itemsize + 7) & ~7)
    names = [n for n, _ in RINGBUF_HDR] + list(record.names)
    formats = [f for _, f in RINGBUF_HDR] + [record.fields[n][0] for n in record.names]
    offsets = [0, 4] + [8 + record.fields[n][1] for n in record.names]
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": size})


def require_fields(dtype, names, what):
    """LayoutError unless `dtype` has every field the reader uses."""
    missing = [n for n in names if n not in dtype.names]
    if missing:
        raise LayoutError(
            f"{what}: the compiled layout lacks field(s) {', '.join(missing)} "
            f"that the reader uses (header and reader out of step)"
        )


# ----- counters ------------------------------------------------------------------


class Counters:
    """A one-entry BPF_F_MMAPABLE array of `struct counters` (u64 fields),
    read without a bpf() syscall: map syscalls raise the CPU's
    bpf_prog_active, and a tracepoint program firing on that CPU meanwhile
    is skipped."""

    def __init__(self, bpf, map_name="counters"):
        table = bpf[map_name.encode()]
        self.dtype = struct_dtype(table.Leaf)
        for name in self.dtype.names:
            if self.dtype.fields[name][0] != np.dtype("<u8"):
                raise LayoutError(f"counter {name} must be a u64")
        self._map = mmap.mmap(table.map_fd, PAGE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        self._view = np.frombuffer(self._map, dtype=self.dtype, count=1)

    def read(self):
        return {name: int(self._view[name][0]) for name in self.dtype.names}

    def close(self):
        self._view = None
        self._map.close()


# ----- reader cadence ------------------------------------------------------------


# Set by the daemon while someone watches the live stream (alerts hold a
# step 250 ms for its off-CPU rows): readers then read at full rate.
LIVE = threading.Event()


class Cadence:
    """How long a ring reader waits before its next read, from what the last
    read found: `poll_s` while reads come back with `batch_records` or more
    (a busy ring is read at full rate), doubling up to `busy_max_s` while
    they come back with fewer (the reads' fixed cost, ~1 ms of numpy and
    Arrow for the sched ring, is paid per batch, not per clock tick), and up
    to `idle_max_s` while they come back empty (a quiet daemon wakes once a
    second per reader, not 50). The ring is sized for 0.4 s of 200k
    events/s; a reader whose ring holds more than 5 % of it is woken at the
    main loop's next tick, 0.1-0.5 s apart (threads.HURRY_ABOVE), so a
    burst after a quiet second is read long before the ring fills."""

    def __init__(self, poll_s, busy_max_s=1.0, idle_max_s=1.0, batch_records=1024):
        self.poll_s = poll_s
        self.busy_max_s = max(busy_max_s, poll_s)
        self.idle_max_s = max(idle_max_s, poll_s)
        self.batch_records = batch_records
        self.wait_s = poll_s

    def next(self, records):
        """The wait before the next read, after a read of `records`."""
        if records >= self.batch_records or LIVE.is_set():
            self.wait_s = self.poll_s
        elif records:
            self.wait_s = min(self.wait_s * 2, self.busy_max_s)
            self.wait_s = max(self.wait_s, self.poll_s)
        else:
            self.wait_s = min(self.wait_s * 2, self.idle_max_s)
        return self.wait_s


# ----- ring buffer ---------------------------------------------------------------


class RingReader:
    """User-space consumer of a BPF ring buffer map holding one record type
    (`dtype`; None for a ring whose records carry nothing but their arrival,
    consumed with `skip()` alone)."""

    def __init__(self, bpf, map_name, dtype, pages):
        # Layout of a BPF ring buffer map (kernel/bpf/ringbuf.c): page 0 is the
        # consumer position (ours to write), page 1 the producer position, then
        # the data area mapped twice in a row so a record that wraps around
        # reads as one contiguous slice.
        fd = self.fd = bpf[map_name.encode()].map_fd  # readable when records wait
        self.dtype = dtype
        self.record_len = None if dtype is None else dtype.itemsize - 8
        self.name = map_name
        self._size = pages * PAGE_SIZE
        self._mask = self._size - 1
        self._cons = mmap.mmap(
            fd, PAGE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0
        )
        self._prod = mmap.mmap(
            fd, PAGE_SIZE + 2 * self._size, mmap.MAP_SHARED, mmap.PROT_READ, offset=PAGE_SIZE
        )
        self._data = np.frombuffer(self._prod, dtype=np.uint8)
        self._released = struct.unpack_from("<Q", self._cons, 0)[0]

    def read(self):
        """Every committed record so far (a copy), oldest first; the space is
        handed back to the kernel before returning."""
        recs = self.peek(copy=True)
        self.release()
        return recs

    def peek(self, copy=False):
        """Every committed record so far, oldest first, without handing their
        space back: with `copy=False` a view into the ring itself, valid
        until `release()` (the kernel writes over none of it until then).
        A reader that uses a few bytes of a large record (the CPU sampler's
        1,064 B, ~130 of them used) then pulls those cache lines alone from
        the CPU that wrote them: a copy of 200 such records cost the reader
        ~370 us, mostly cache misses. Every record was committed whole."""
        cons = self._released = struct.unpack_from("<Q", self._cons, 0)[0]
        prod = struct.unpack_from("<Q", self._prod, 0)[0]
        avail = min(prod - cons, self._size)
        n = avail // self.dtype.itemsize
        if n <= 0:
            return np.empty(0, dtype=self.dtype)
        start = PAGE_SIZE + (cons & self._mask)
        raw = np.frombuffer(self._data, dtype=self.dtype, count=n, offset=start)
        busy = np.flatnonzero(raw["hdr_len"] & np.uint32(RINGBUF_BUSY_BIT))
        if busy.size:
            n = int(busy[0])  # committed in order: the records after it wait too
            raw = raw[:n]
        lens = raw["hdr_len"] & ~np.uint32(RINGBUF_BUSY_BIT | RINGBUF_DISCARD_BIT)
        if np.any(lens != self.record_len):
            # Only our program writes this ring, always record_len bytes.
            raise LayoutError(f"ring {self.name} holds a record of unexpected size")
        self._released = cons + n * self.dtype.itemsize
        if copy and n:
            # As bytes: numpy copies a struct dtype with holes (struct_dtype
            # leaves padding out) field by field, ~15x slower than a memcpy.
            size = n * self.dtype.itemsize
            raw = self._data[start : start + size].copy().view(self.dtype)
        keep = (raw["hdr_len"] & np.uint32(RINGBUF_DISCARD_BIT)) == 0
        return raw if keep.all() else raw[keep]

    def fill(self):
        """The fraction of the ring holding unread records (0..1), from the two
        positions alone: cheap enough to ask every tick."""
        cons = struct.unpack_from("<Q", self._cons, 0)[0]
        prod = struct.unpack_from("<Q", self._prod, 0)[0]
        return min(prod - cons, self._size) / self._size

    def release(self):
        """Hand the space of the records the last `peek()` returned back to
        the kernel (views of them must not be used after this)."""
        struct.pack_into("<Q", self._cons, 0, self._released)

    def skip(self):
        """Hand every record written so far back to the kernel unread; how
        many bytes they held (0: none since the last call)."""
        cons = struct.unpack_from("<Q", self._cons, 0)[0]
        prod = self._released = struct.unpack_from("<Q", self._prod, 0)[0]
        if prod != cons:
            struct.pack_into("<Q", self._cons, 0, prod)
        return prod - cons

    def close(self):
        self._data = None
        self._cons.close()
        self._prod.close()


def program_stats(bpf):
    """Per program: run_cnt, run_time_ns (both 0 unless sysctl
    kernel.bpf_stats_enabled=1) and recursion_misses (runs the kernel
    skipped because another BPF program was running on that CPU)."""
    out = {}
    for name, fn in bpf.funcs.items():
        stats = {}
        try:
            with open(f"/proc/self/fdinfo/{fn.fd}") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in ("run_cnt", "run_time_ns", "recursion_misses"):
                        stats[key] = int(value)
        except OSError:
            continue
        out[name.decode().rsplit("__", 1)[-1]] = stats
    return out


# Odd 64-bit multipliers of the row hash in unique_rows (fixed: the hash
# only groups rows within a batch, and every group is checked word for word).
_ROW_MIX = np.random.default_rng(0x5EED).integers(1, 2**63, 1 + 2 * 192, dtype=np.uint64) | 1


def unique_rows(keys):
    """(first index, inverse) of the distinct rows of a uint64 matrix (at
    most len(_ROW_MIX) columns), as np.unique(..., return_index,
    return_inverse) gives: rows are grouped by a 64-bit hash, then every row
    is compared with its group's first, so a collision costs time (the exact,
    slower grouping), never a wrong group."""
    n, width = keys.shape
    h = keys @ _ROW_MIX[:width]  # wraps mod 2**64; ~2-5x faster than (keys * mix).sum(1)
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.ravel()
    if not np.array_equal(keys, keys[first[inv]]):
        rows = np.ascontiguousarray(keys).view(np.dtype((np.void, 8 * width))).ravel()
        _, first, inv = np.unique(rows, return_index=True, return_inverse=True)
        inv = inv.ravel()
    return first, inv.astype(np.int64)


def decode_comm(values, *valids):
    """One pyarrow string column (dictionary-encoded) per mask in `valids`
    from an 'S16' column, NULL where the mask is false. comm values repeat a
    lot, so each distinct one is decoded once (grouped by `unique_rows` over
    their two 64-bit words)."""
    import pyarrow as pa

    values = np.ascontiguousarray(values, dtype="S16")
    masks = [~np.asarray(v, dtype=bool) for v in valids]
    if len(values) == 0:
        return [pa.array([], type=pa.string()) for _ in masks]
    first, inverse = unique_rows(values.view("<u8").reshape(-1, 2))
    names = pa.array([v.decode("utf-8", "replace") for v in values[first].tolist()], pa.string())
    inverse = inverse.astype(np.int32)
    return [pa.DictionaryArray.from_arrays(pa.array(inverse, mask=m), names) for m in masks]


def nullable(values, valid, dtype):
    """A pyarrow array of `values` as `dtype`, NULL where not `valid`."""
    import pyarrow as pa

    return pa.array(np.asarray(values).astype(dtype), mask=~valid)
