"""CPU sampler stacks: sample records in, `cpu_samples` / `cpu_stacks` / `cpu_frames` rows out.

`StackTable.resolve(recs)` takes one drain's `sample` records (numpy, from
cpu_bcc.c) and returns the rows to append. A sample's stack is its native
leaf (the interrupted user IP, symbolized while the process is alive: by
bcc's symbolizer from bcc 0.33 on, else from the maps and ELF files,
cpu_elf.py) followed by its Python frames, innermost first; each
frame is a (kind, file or module, function, line) and is stored once
(`cpu_frames`), each distinct stack once (`cpu_stacks`: one row per frame,
depth 0 the leaf), and each sample as one small row naming its stack. The
work is per distinct raw stack of the batch, not per sample: the Python
frames of every sample are deduplicated by a checked hash of their raw
words (`bpf_common.unique_rows`), the native leaves by (pid, IP), and only new combinations reach
Python code. Frame names come from `symbol` records (`add_symbol`); a frame
whose (code address, checksum) has no symbol is "<unknown>", never the name
of another code object that once had the address. Lines come from the
symbol's line table (cpu_lines.py).

Ids are 64-bit, counted up from the wall clock at start, so no two daemon
runs share one and nothing is read back from the database. The id caches
start afresh every `vocab.schema.CPU_STACK_EPOCH_NS` (new ids for the same
content from then on), so an id is referenced only by samples of its own
epoch or the next: retention may delete a frame or stack that no sample
uses and that is older than two epochs without ever leaving a sample's id
dangling. Nothing here touches the kernel or the database.
"""

import ctypes as ct
import os
import time

import numpy as np
import pyarrow as pa

from stallscope.probes import bpf_common
from stallscope.probes.cpu_elf import MapsSymbolizer
from stallscope.probes.cpu_lines import Symbol
from stallscope.vocab.schema import CPU_STACK_EPOCH_NS

_DEFINES = bpf_common.header_defines("cpu_bcc.h", "CPU_")
_STATUS = {k: v for k, v in _DEFINES.items() if not k.startswith("CPU_F_")}  # name -> code
CPU_OK = _STATUS["CPU_OK"]
CPU_F_TRUNCATED = _DEFINES["CPU_F_TRUNCATED"]
CPU_F_FAULT = _DEFINES["CPU_F_FAULT"]
# cpu_samples.unwind: how far the Python unwinding got (NULL: all of it)
UNWIND = {
    "CPU_NO_TSTATE": "no_tstate",
    "CPU_TSTATE_FAULT": "tstate_fault",
    "CPU_NO_PYTHON": "no_python",
}
UNWIND_REASONS = ("no_tstate", "tstate_fault", "no_python", "frame_fault", "truncated")
_UNWIND_DICT = pa.array(UNWIND_REASONS, type=pa.string())
UNKNOWN_PY = ("py", None, "<unknown>", None)
# Caches that are only an optimisation are cleared past these sizes.
MAX_RESOLVED = 1 << 18
MAX_SYMBOLS = 1 << 18


# bcc before 0.33 closes a stale file descriptor each time its symbolizer
# loads a process's modules (ProcSyms::ModulePath leaves fd_ unset for the
# global /tmp/perf-PID.map it tries, and its destructor closes whatever
# value that memory held: iovisor/bcc 68710c4f, January 2025). In a daemon
# whose main thread accepts sockets meanwhile, that number is often a live
# client's socket, closed behind the listener's back. Debian 12 ships 0.26.
BCC_SYMBOLIZER_SAFE_FROM = (0, 33)


def bcc_symbolizer_safe(version=None):
    """Whether this bcc's SymbolCache may be used in the daemon (see above)."""
    if version is None:
        try:
            from bcc.version import __version__ as version
        except ImportError:
            return False
    try:
        parts = tuple(int(x) for x in str(version).split(".")[:2])
    except ValueError:
        return False
    return parts >= BCC_SYMBOLIZER_SAFE_FROM


class _Natives:
    """(pid, IP) -> ('native', module, function, None), with bcc's symbolizer
    (/proc/PID/maps and the modules' ELF symbols: the process must be alive)
    where this bcc's is safe and the daemon may follow the process's
    /proc/PID/root, else with cpu_elf's from the maps (another user's
    process without CAP_SYS_PTRACE, or any process with bcc < 0.33)."""

    def __init__(self, enabled=True, use_bcc=None):
        self.enabled = enabled
        self.use_bcc = bcc_symbolizer_safe() if use_bcc is None else use_bcc
        self._caches = {}  # pid -> bcc SymbolCache
        self._by_maps = {}  # pid -> whether bcc cannot open its files (cpu_elf instead)
        self._maps = MapsSymbolizer()
        self._resolved = {}  # (pid, ip) -> content
        self._refreshed = set()  # pids whose cache was re-read this drain
        self.lookups = 0

    def begin_drain(self):
        self._refreshed.clear()

    def content(self, pid, ip):
        key = (pid, ip)
        got = self._resolved.get(key)
        if got is not None:
            return got
        got = self._lookup(pid, ip)
        if len(self._resolved) > MAX_RESOLVED:
            self._resolved.clear()
        self._resolved[key] = got
        return got

    def _lookup(self, pid, ip):
        if not self.enabled:
            return ("native", None, None, None)
        self.lookups += 1
        name, module = self._resolve(pid, ip)
        if module is None and pid not in self._refreshed and not self._mapped(pid, ip):
            # A module mapped after the cache read the maps (dlopen): re-read
            # once a drain (forget() drops the cache: the next resolve reads it).
            self._refreshed.add(pid)
            self.forget(pid)
            name, module = self._resolve(pid, ip)
        text = lambda b: b.decode("utf-8", "replace") if b else None  # noqa: E731
        return ("native", text(module), text(name), None)

    def _resolve(self, pid, ip):
        by_maps = self._by_maps.get(pid)
        if by_maps is None and not self.use_bcc:
            by_maps = self._by_maps[pid] = True
        if by_maps is None:
            try:
                os.stat(f"/proc/{pid}/root/")
                by_maps = False
            except PermissionError:
                by_maps = True
            except OSError:
                by_maps = False
            self._by_maps[pid] = by_maps
        if by_maps:
            return self._maps.resolve(pid, ip)
        try:
            cache = self._caches.get(pid)
            if cache is None:
                from bcc import SymbolCache

                cache = self._caches[pid] = SymbolCache(pid)
            name, _, module = cache.resolve(ip, True)
            return name, module
        except Exception:  # a process that is gone, an unreadable module
            return None, None

    def _mapped(self, pid, ip):
        """Whether the maps read for `pid` had `ip` in executable memory
        (the maps symbolizer's; bcc's cache does not say)."""
        return bool(self._by_maps.get(pid)) and self._maps.mapped(pid, ip)

    def forget(self, pid):
        self._maps.forget(pid)
        cache = self._caches.pop(pid, None)
        if cache is not None:
            try:
                from bcc.libbcc import lib

                lib.bcc_free_symcache(ct.c_void_p(cache.cache), pid)
            except Exception:
                pass

    def forget_pid(self, pid):
        self.forget(pid)
        self._by_maps.pop(pid, None)
        for key in [k for k in self._resolved if k[0] == pid]:
            del self._resolved[key]


def _frame_keys(recs):
    """(keys, depth): per sample, its pid and Python frames as uint64 words
    (pid, then two words a frame, entries past the sample's depth zeroed: the
    ring leaves them as garbage), `1 + 2 * max depth` columns. Read as bytes
    from the records: numpy copies a field of a struct dtype with holes
    element by element, ~10x slower."""
    n = len(recs)
    depth = recs["depth"].astype(np.int64)
    dmax = int(depth.max())
    keys = np.zeros((n, 1 + 2 * dmax), dtype=np.uint64)
    keys[:, 0] = recs["pid"]
    if dmax:
        off = recs.dtype.fields["frames"][1]
        raw = np.ascontiguousarray(recs).view(np.uint8).reshape(n, recs.dtype.itemsize)
        frames = keys[:, 1:]
        frames.view(np.uint8)[:] = raw[:, off : off + 16 * dmax]
        frames.reshape(n, dmax, 2)[np.arange(dmax)[None, :] >= depth[:, None]] = 0
    return keys, depth


def _unique_pairs(a, b):
    """(first index, inverse) of the distinct (a, b) pairs, exact, by one
    lexsort (np.unique on a struct array is ~10x slower)."""
    n = len(a)
    order = np.lexsort((b, a))
    sa, sb = a[order], b[order]
    new = np.empty(n, dtype=bool)
    new[:1] = True
    new[1:] = (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])
    inv = np.empty(n, dtype=np.int64)
    inv[order] = np.cumsum(new) - 1
    return order[new], inv


class StackTable:
    """Symbols, frames and stacks of the sampled processes (one reader thread)."""

    def __init__(self, symbolize=True, epoch_ns=CPU_STACK_EPOCH_NS, clock=time.monotonic_ns):
        self._next_id = time.time_ns()
        self.symbols = {}  # (pid, code, cksum) -> Symbol
        self.versions = {}  # pid -> (major, minor) of its interpreter
        self.natives = _Natives(symbolize)
        self._pycontent = {}  # (pid, code, cksum, lasti) -> content
        self.epoch_ns = epoch_ns
        self._clock = clock
        self._epoch_start = clock()
        self._new_epoch()
        # tid -> (ts_ns, frame ids leaf first) of its latest sample: the hang
        # watchdog's on-CPU stacks (service/hang.py); replaced, never grown per sample
        self.latest = {}
        self.frames_written = 0
        self.stacks_written = 0
        self.unknown_frames = 0
        self.epochs = 0

    def _new_epoch(self):
        self._frame_ids = {}  # content -> frame_id
        self._pystacks = {}  # raw Python frames (bytes) -> tuple of frame ids
        self._stack_ids = {}  # tuple of frame ids (leaf first) -> stack_id
        self._native_ids = {}  # (pid, IP) -> frame_id of its function

    def _id(self):
        self._next_id += 1
        return self._next_id

    # ----- what the probe tells us ---------------------------------------------------
    def set_version(self, pid, version):
        self.versions[pid] = tuple(version[:2])

    def add_symbols(self, recs):
        """Decode a drain's `symbol` records."""
        if len(self.symbols) + len(recs) > MAX_SYMBOLS:
            self.symbols.clear()  # bounded; a frame named later is "<unknown>" at worst
        for rec in recs:
            pid = int(rec["pid"])
            version = self.versions.get(pid, (3, 11))
            self.symbols[(pid, int(rec["code"]), int(rec["cksum"]))] = Symbol(rec, version)

    def forget_pid(self, pid):
        self.versions.pop(pid, None)
        for key in [k for k in self._native_ids if k[0] == pid]:
            del self._native_ids[key]  # a recycled pid maps other code at these IPs
        for key in [k for k in self.symbols if k[0] == pid]:
            del self.symbols[key]
        for key in [k for k in self._pycontent if k[0] == pid]:
            del self._pycontent[key]
        self.natives.forget_pid(pid)

    # ----- one drain ---------------------------------------------------------------------
    def resolve(self, recs):
        """{table: columns} for a batch of sample records (may be empty)."""
        n = len(recs)
        if n == 0:
            return {}
        now = self._clock()
        if now - self._epoch_start >= self.epoch_ns:
            self._epoch_start = now
            self._new_epoch()
            self.epochs += 1
        self.natives.begin_drain()
        ts = recs["ts_ns"].astype(np.int64)
        first_ts = int(ts.min())
        new_frames = []  # (frame_id, content)
        new_stacks = []  # (stack_id, frame ids)

        def frame_id(content):
            fid = self._frame_ids.get(content)
            if fid is None:
                fid = self._frame_ids[content] = self._id()
                new_frames.append((fid, content))
            return fid

        # Python frames: one entry per distinct (pid, frames) of the batch.
        pid = recs["pid"].astype(np.uint32)
        keys, depth = _frame_keys(recs)
        if keys.shape[1] > 1:
            py_first, py_inv = bpf_common.unique_rows(keys)
            py_stacks = []
            for i in py_first.tolist():
                u = keys[i, : 1 + 2 * int(depth[i])].tobytes()
                got = self._pystacks.get(u)
                if got is None:
                    frames = recs["frames"][i, : depth[i]]
                    got, complete = self._py_frames(int(pid[i]), frames, frame_id)
                    if complete:  # one with an unknown frame is looked at again next time
                        self._pystacks[u] = got
                py_stacks.append(got)
        else:
            py_inv = np.zeros(n, dtype=np.int64)
            py_stacks = [()]
        # Native leaves: one dictionary lookup per distinct (pid, IP), one id
        # per function, and a small rank per distinct id for the grouping below.
        ip = recs["user_ip"].astype(np.uint64)
        nat_first, nat_inv = _unique_pairs(pid, ip)
        nat_ids = np.zeros(len(nat_first), dtype=np.int64)
        nat_ranks = np.zeros(len(nat_first), dtype=np.int64)
        rank_of = {0: 0}
        native_ids = self._native_ids
        if len(native_ids) > MAX_RESOLVED:
            native_ids.clear()
        pairs = zip(pid[nat_first].tolist(), ip[nat_first].tolist(), strict=True)
        for k, (p, a) in enumerate(pairs):
            if not a:
                continue
            fid = native_ids.get((p, a))
            if fid is None:
                fid = native_ids[(p, a)] = frame_id(self.natives.content(p, a))
            nat_ids[k] = fid
            nat_ranks[k] = rank_of.setdefault(fid, len(rank_of))
        nat = nat_ids[nat_inv]
        # Stacks: one lookup per distinct (Python frames, native leaf function).
        combo = py_inv * len(rank_of) + nat_ranks[nat_inv]
        uniq_c, first_c, c_inv = np.unique(combo, return_index=True, return_inverse=True)
        stack_ids = np.zeros(len(uniq_c), dtype=np.int64)
        valid = np.zeros(len(uniq_c), dtype=bool)
        combo_frames = []
        for k, i in enumerate(first_c.tolist()):
            frames = py_stacks[py_inv[i]]
            if nat[i]:
                frames = (int(nat[i]), *frames)
            combo_frames.append(frames)
            if not frames:
                continue  # nothing known about this sample's code: stack_id NULL
            sid = self._stack_ids.get(frames)
            if sid is None:
                sid = self._stack_ids[frames] = self._id()
                new_stacks.append((sid, frames))
            stack_ids[k] = sid
            valid[k] = True
        c_inv = c_inv.ravel()
        self._note_latest(recs["tid"], ts, c_inv, combo_frames)
        out = {
            "cpu_samples": {
                "pid": pid.astype(np.int32),
                "tid": recs["tid"].astype(np.int32),
                "ts_ns": ts,
                "cpu": recs["cpu"].astype(np.int16),
                "stack_id": pa.array(
                    stack_ids[c_inv], mask=None if valid.all() else ~valid[c_inv], type=pa.int64()
                ),
                "kernel_mode": recs["kernel_mode"].astype(bool),
                "unwind": self._unwind(recs),
            }
        }
        if new_stacks:
            out["cpu_stacks"] = {
                "stack_id": np.repeat(
                    np.array([s for s, _ in new_stacks], dtype=np.int64),
                    [len(f) for _, f in new_stacks],
                ),
                "depth": np.concatenate([np.arange(len(f), dtype=np.int16) for _, f in new_stacks]),
                "frame_id": np.array([x for _, f in new_stacks for x in f], dtype=np.int64),
                "first_ts_ns": np.full(sum(len(f) for _, f in new_stacks), first_ts, np.int64),
            }
            self.stacks_written += len(new_stacks)
        if new_frames:
            out["cpu_frames"] = {
                "frame_id": np.array([f for f, _ in new_frames], dtype=np.int64),
                "kind": pa.array([c[0] for _, c in new_frames], type=pa.string()),
                "file": pa.array([c[1] for _, c in new_frames], type=pa.string()),
                "function": pa.array([c[2] for _, c in new_frames], type=pa.string()),
                "line": pa.array([c[3] for _, c in new_frames], type=pa.int32()),
                "first_ts_ns": np.full(len(new_frames), first_ts, np.int64),
            }
            self.frames_written += len(new_frames)
        return out

    def _note_latest(self, tids, ts, c_inv, combo_frames):
        """Each thread's latest sample of the batch: its time and stack."""
        tids = tids.astype(np.int64)
        if tids[0] == tids.min() == tids.max():
            last = [int(ts.argmax())]  # one thread sampled: the common case
        else:
            order = np.lexsort((ts, tids))  # by thread, then time: the last of each run
            last = order[np.r_[tids[order][1:] != tids[order][:-1], True]].tolist()
        if len(self.latest) > MAX_RESOLVED:
            self.latest.clear()
        for i in last:
            self.latest[int(tids[i])] = (int(ts[i]), combo_frames[c_inv[i]])

    def _py_frames(self, pid, frames, frame_id):
        """(frame ids innermost first, whether every frame had its symbol)."""
        out = []
        complete = True
        for code, lasti, cksum in zip(
            frames["code"].tolist(), frames["lasti"].tolist(), frames["cksum"].tolist(), strict=True
        ):
            key = (pid, code, cksum, lasti)
            content = self._pycontent.get(key)
            if content is None:
                sym = self.symbols.get((pid, code, cksum))
                if sym is None:
                    self.unknown_frames += 1
                    complete = False
                    out.append(frame_id(UNKNOWN_PY))
                    continue  # not cached: its symbol may still come
                content = ("py", sym.file, sym.name, sym.line(lasti))
                if len(self._pycontent) > MAX_RESOLVED:
                    self._pycontent.clear()
                self._pycontent[key] = content
            out.append(frame_id(content))
        return tuple(out), complete

    @staticmethod
    def _unwind(recs):
        """cpu_samples.unwind per sample (dictionary-encoded): NULL when every
        frame was walked, else the reason (UNWIND_REASONS)."""
        status = recs["status"]
        flags = recs["flags"]
        if not (status != CPU_OK).any() and not (flags & (CPU_F_FAULT | CPU_F_TRUNCATED)).any():
            # every frame walked: the common case
            return pa.DictionaryArray.from_arrays(pa.nulls(len(recs), pa.int8()), _UNWIND_DICT)
        codes = np.zeros(len(recs), dtype=np.int8)  # 0: NULL
        for name, label in UNWIND.items():
            codes[status == _STATUS[name]] = UNWIND_REASONS.index(label) + 1
        ok = status == CPU_OK
        codes[ok & ((flags & CPU_F_FAULT) != 0)] = UNWIND_REASONS.index("frame_fault") + 1
        codes[ok & ((flags & CPU_F_TRUNCATED) != 0)] = UNWIND_REASONS.index("truncated") + 1
        return pa.DictionaryArray.from_arrays(
            pa.array(codes - 1, mask=codes == 0, type=pa.int8()), _UNWIND_DICT
        )
