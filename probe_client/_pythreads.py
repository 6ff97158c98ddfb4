"""The CPU sampler's thread-state report, made in the traced process itself.

The daemon's BPF sampler (stallscope/probes/cpu_bcc.c) walks Python frames
from a thread's PyThreadState, which it cannot find from outside without
reading task_struct or TLS (both unreliable there). So this process says,
over its own probe connection: where this interpreter keeps its frames
(PYLAYOUT, once per connection) and which PyThreadState belongs to which
kernel thread (PYTHREADS, whenever that changed). Standard library and
ctypes only; no ptrace, no /proc/PID/mem of another process:

- thread states: `PyInterpreterState_Head()` ->
  `PyInterpreterState_ThreadHead()` -> `PyThreadState_Next()` through
  `ctypes.pythonapi` (PyDLL(None): works for a shared libpython and for
  Debian's static, non-PIE /usr/bin/python3, whose .dynsym exports the API),
  each paired with its kernel thread id (`native_thread_id` on 3.11+,
  `threading`'s `native_id` by pthread ident on 3.10); every thread state
  is listed, threads that never record a span included;
- layout: the per-version table in `pyoffsets.py`, overridden by what the
  interpreter says itself: code-object member offsets from
  `PyCode_Type.tp_members`, `co_code_adaptive` from `tp_basicsize`, and on
  3.13+ every field `_Py_DebugOffsets` (cookie "xdebugpy" at the start of
  `_PyRuntime`) carries;
- verification before "ok": the frame chain of every other thread, walked
  with those offsets from raw memory, must equal `sys._current_frames()`
  code object by code object and f_lasti by f_lasti (a parked a -> b -> c
  thread guarantees one), and str/bytes layouts, `_co_firsttraceable` and
  the GIL holder word are checked on known objects. Raw reads go through
  `process_vm_readv` on this process (a PyDLL, so the GIL stays held), so a
  wrong offset is an error return, never a crash.

Runs only in the client's background flusher (`_transport.py`, about once
a second), never on the hot path: the one-time set-up costs 30-100 ms of
that thread, a listing ~50 us for 50 threads. An interpreter it does not
know (3.9, 3.14, a free-threaded build) is refused with a reason, never
guessed; nothing here raises into the caller.
"""

import ctypes
import json
import os
import platform
import struct
import sys
import threading
import time

from . import pyoffsets, wire


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class Mem:
    """Reads this process's own memory without trusting the address: a bad
    one is an error return, never a SIGSEGV. process_vm_readv on ourselves,
    called through a PyDLL so the GIL stays held (other threads cannot move
    their frames while we walk them); /proc/self/mem (os.pread, which drops
    the GIL) only where that syscall is refused."""

    def __init__(self):
        self.pid = os.getpid()
        self._buf = ctypes.create_string_buffer(4096)
        self._local = _Iovec(ctypes.cast(self._buf, ctypes.c_void_p), 0)
        self._remote = _Iovec(None, 0)
        self.fd = None
        try:
            fn = ctypes.PyDLL(None).process_vm_readv
            fn.restype = ctypes.c_ssize_t
            fn.argtypes = [
                ctypes.c_int,
                ctypes.POINTER(_Iovec),
                ctypes.c_ulong,
                ctypes.POINTER(_Iovec),
                ctypes.c_ulong,
                ctypes.c_ulong,
            ]
            self._vm = fn
            if self._read_vm(id(self), 8) is None:
                raise OSError("process_vm_readv refused")
            self.method = "process_vm_readv"
        except (AttributeError, OSError):
            self._vm = None
            self.fd = os.open("/proc/self/mem", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            self.method = "/proc/self/mem"

    def _read_vm(self, addr, n):
        self._local.len = n
        self._remote.base = addr
        self._remote.len = n
        got = self._vm(self.pid, ctypes.byref(self._local), 1, ctypes.byref(self._remote), 1, 0)
        return self._buf.raw[:n] if got == n else None

    def read(self, addr, n):
        if not addr or addr < 4096 or addr >= 1 << 47 or not 0 < n <= 4096:
            return None
        if self._vm is not None:
            return self._read_vm(addr, n)
        try:
            data = os.pread(self.fd, n, addr)
        except OSError:
            return None
        return data if len(data) == n else None

    def u64(self, addr):
        b = self.read(addr, 8)
        return struct.unpack("<Q", b)[0] if b else None

    def i32(self, addr):
        b = self.read(addr, 4)
        return struct.unpack("<i", b)[0] if b else None

    def u8(self, addr):
        b = self.read(addr, 1)
        return b[0] if b else None

    def cstr(self, addr, limit=128):
        b = self.read(addr, limit)
        if b is None:
            return None
        return b.split(b"\0", 1)[0].decode("ascii", "replace")

    def close(self):
        if self.fd is not None:
            os.close(self.fd)


_API = []


def _api():
    """ctypes.pythonapi with the thread-walk functions' signatures set (once)."""
    if not _API:
        api = ctypes.pythonapi
        api.PyInterpreterState_Head.restype = ctypes.c_void_p
        api.PyInterpreterState_Head.argtypes = []
        api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
        api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
        api.PyThreadState_Next.restype = ctypes.c_void_p
        api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
        _API.append(api)
    return _API[0]


def free_threaded():
    try:
        import sysconfig

        return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    except Exception:
        return False


def code_members(mem, layout):
    """{member name: offset} from PyCode_Type.tp_members."""
    tp = id(types_code())
    members = mem.u64(tp + layout["tp_members"])
    out = {}
    size = layout["memberdef_size"]
    for i in range(64):
        rec = mem.read(members + i * size, size) if members else None
        if rec is None:
            break
        name_ptr = struct.unpack_from("<Q", rec, 0)[0]
        if not name_ptr:
            break
        off = struct.unpack_from("<q", rec, layout["memberdef_offset"])[0]
        out[mem.cstr(name_ptr, 64)] = off
    return out


def types_code():
    return type(types_code.__code__)


def debug_offsets(mem):
    """(3.13+) {(section, field): value} of _Py_DebugOffsets, or None."""
    try:
        runtime = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
    except (ValueError, AttributeError):
        return None
    head = mem.read(runtime, 8)
    if head != b"xdebugpy":
        return None
    out = {}
    pos = runtime + 8
    for section, fields in pyoffsets.DEBUG_OFFSETS_313[1:]:
        for f in fields or [None]:
            out[(section, f) if f else (section,)] = mem.u64(pos)
            pos += 8
    return out


def build_layout(mem):
    """(layout dict, notes list) for this interpreter, or raises ValueError(reason)."""
    why = pyoffsets.refusal(
        sys.version_info, free_threaded(), sys.implementation.name, platform.machine()
    )
    if why:
        raise ValueError(why)
    layout = pyoffsets.layout_for(sys.version_info)
    notes = []
    code_type = types_code()
    tp = id(code_type)
    # the PyTypeObject offsets themselves: tp_name must read "code", sizes must match
    name_ptr = mem.u64(tp + layout["tp_name"])
    if mem.cstr(name_ptr or 0) != "code":
        raise ValueError("PyTypeObject layout mismatch (tp_name of the code type)")
    basic = mem.u64(tp + layout["tp_basicsize"])
    if (
        basic != code_type.__basicsize__
        or mem.u64(tp + layout["tp_itemsize"]) != code_type.__itemsize__
    ):
        raise ValueError("PyTypeObject layout mismatch (tp_basicsize)")
    members = code_members(mem, layout)
    if "co_filename" not in members:
        raise ValueError("PyCode_Type.tp_members unreadable")
    for mname, key in pyoffsets.CODE_MEMBERS.items():
        if mname in members:
            if layout[key] != members[mname]:
                notes.append(
                    f"{mname}: table {layout[key]}, tp_members {members[mname]} (tp_members used)"
                )
            layout[key] = members[mname]
        elif layout[key] != pyoffsets.NONE:
            raise ValueError(f"code member {mname} missing from tp_members")
    if layout["co_code_adaptive"] != pyoffsets.NONE:
        if layout["co_code_adaptive"] != basic:
            notes.append(
                f"co_code_adaptive: table {layout['co_code_adaptive']}, tp_basicsize {basic} "
                "(tp_basicsize used)"
            )
        layout["co_code_adaptive"] = basic
    layout["source"] = "table+tp_members"
    if sys.version_info >= (3, 13):
        dbg = debug_offsets(mem)
        if dbg is None:
            raise ValueError("3.13+ without a readable _Py_DebugOffsets")
        if dbg.get(("version",)) != sys.hexversion:
            notes.append(
                "_Py_DebugOffsets version {:#x} != sys.hexversion {:#x}".format(
                    dbg.get(("version",)) or 0, sys.hexversion
                )
            )
        if dbg.get(("free_threaded",)):
            raise ValueError("_Py_DebugOffsets says free-threaded: not supported")
        for field, key in pyoffsets.FROM_DEBUG_OFFSETS.items():
            val = dbg.get(field)
            if val is None:
                raise ValueError("_Py_DebugOffsets lacks {}.{}".format(*field))
            if layout[key] != val and layout[key] != pyoffsets.NONE:
                notes.append(
                    f"{key}: table {layout[key]}, _Py_DebugOffsets {val} (debug offsets used)"
                )
            layout[key] = val
        layout["source"] = (
            "_Py_DebugOffsets (+tp_members; table for co_flags, "
            "_co_firsttraceable, compact str data)"
        )
    # bytes the BPF side reads of each object head: up to the last field used
    for rk, keys in pyoffsets.HEAD_FIELDS.items():
        need = max(layout[k] + w for k, w in keys if layout[k] != pyoffsets.NONE)
        layout[rk] = (need + 7) & ~7
    return layout, notes


def _check_objects(mem, layout):
    """str, bytes and code layouts against objects whose contents we know."""
    s = "stallscope_ascii"
    a = id(s)
    if mem.u64(a + layout["str_length"]) != len(s):
        raise ValueError("str length offset wrong")
    state = mem.u8(a + layout["str_state"])
    if not (state >> 5) & 1 or not (state >> 6) & 1 or (state >> 2) & 7 != 1:
        raise ValueError("str state bits wrong (compact ascii kind 1 expected)")
    if mem.read(a + layout["str_ascii_data"], len(s)) != s.encode():
        raise ValueError("compact ASCII data offset wrong")
    u = "stallscope-\u00e9\u20ac-x"  # non-ASCII: UCS2 compact
    u = u + ""  # a fresh object, not interned
    ua = id(u)
    st = mem.u8(ua + layout["str_state"])
    kind = (st >> 2) & 7
    raw = mem.read(ua + layout["str_compact_data"], len(u) * kind)
    if kind != 2 or raw is None or raw.decode("utf-16-le") != u:
        raise ValueError("compact non-ASCII data offset wrong")
    u.encode("utf-8")
    b = b"stallscope-bytes"
    if (
        mem.u64(id(b) + layout["bytes_size"]) != len(b)
        or mem.read(id(b) + layout["bytes_data"], len(b)) != b
    ):
        raise ValueError("bytes layout wrong")
    co = _check_objects.__code__
    if mem.u64(id(co) + layout["ob_type"]) != id(type(co)):
        raise ValueError("ob_type offset wrong")
    name_key = "co_qualname" if layout["co_qualname"] != pyoffsets.NONE else "co_name"
    if mem.u64(id(co) + layout[name_key]) != id(getattr(co, name_key)):
        raise ValueError(f"{name_key} offset wrong")
    if (
        mem.u64(id(co) + layout["co_filename"]) != id(co.co_filename)
        or mem.u64(id(co) + layout["co_linetable"]) != id(co.co_linetable)
        or mem.i32(id(co) + layout["co_firstlineno"]) != co.co_firstlineno
        or mem.i32(id(co) + layout["co_argcount"]) != co.co_argcount
        or mem.i32(id(co) + layout["co_flags"]) != co.co_flags
    ):
        raise ValueError("code object field offsets wrong")
    if layout["co_firsttraceable"] != pyoffsets.NONE:
        import dis

        # never executed, so not specialised (3.13 rewrites RESUME to RESUME_CHECK)
        fresh = compile("def f(x):\n    return x\n", "<stallscope>", "exec").co_consts[0]
        ft = mem.i32(id(fresh) + layout["co_firsttraceable"])
        op = mem.u8(id(fresh) + layout["co_code_adaptive"] + 2 * (ft or 0))
        if ft is None or not 0 <= ft < 64 or op != dis.opmap["RESUME"]:
            raise ValueError("_co_firsttraceable / co_code_adaptive offsets wrong")


def gil_holder_address(mem, layout):
    """(address of the GIL's last_holder, note). While a thread runs Python
    it holds the GIL, so that word is its PyThreadState: the sampler's
    fallback for a thread it has no report for yet (checked there against
    the tstate's native_thread_id). Verified here: read from this thread,
    which holds the GIL, it must be our own tstate."""
    api = ctypes.pythonapi
    api.PyThreadState_Get.restype = ctypes.c_void_p
    me = api.PyThreadState_Get()
    if layout["rt_gil_last_holder"] != pyoffsets.NONE:
        try:
            runtime = ctypes.addressof(ctypes.c_char.in_dll(api, "_PyRuntime"))
        except (ValueError, AttributeError):
            return 0, "no _PyRuntime symbol"
        addr = runtime + layout["rt_gil_last_holder"]
    elif layout["interp_gil_holder"] != pyoffsets.NONE:
        addr = _api().PyInterpreterState_Head() + layout["interp_gil_holder"]
    elif layout["interp_ceval_gil"] != pyoffsets.NONE:
        interp = _api().PyInterpreterState_Head()
        gil = mem.u64(interp + layout["interp_ceval_gil"])
        if not gil:
            return 0, "interp->ceval.gil unreadable"
        addr = gil + layout["gil_last_holder"]
    else:
        return 0, "no GIL holder offset for this version"
    if mem.u64(addr) != me:
        return 0, "GIL last_holder offset failed its check (fallback off)"
    return addr, "GIL holder fallback verified"


def pthread_tid_offset(mem):
    """Offset of the kernel tid in libc's thread descriptor (pthread_self(),
    which CPython keeps as tstate->thread_id), or NONE: found in this
    thread's descriptor and confirmed on a second thread. For 3.10, whose
    tstate has no native_thread_id."""
    me, my_tid = threading.get_ident(), threading.get_native_id()
    box = {}
    ev = threading.Event()

    def other():
        box["ident"], box["tid"] = threading.get_ident(), threading.get_native_id()
        ev.wait(5)

    t = threading.Thread(target=other, name="stallscope-pythreads-tid", daemon=True)
    t.start()
    try:
        while "tid" not in box:
            time.sleep(0.001)
        candidates = [720]  # glibc x86-64 (offsetof(struct pthread, tid) == 0x2d0)
        raw = mem.read(me, 2048)
        if raw:
            candidates += [
                o for o in range(0, 2048, 4) if struct.unpack_from("<I", raw, o)[0] == my_tid
            ]
        for off in candidates:
            if mem.read(me + off, 4) == struct.pack("<I", my_tid) and mem.read(
                box["ident"] + off, 4
            ) == struct.pack("<I", box["tid"]):
                return off
        return pyoffsets.NONE
    finally:
        ev.set()
        t.join()


def thread_states(mem, layout, safe=False):
    """[(native thread id or None, tstate address, pthread ident)] of the main
    interpreter, walked through the C API (the GIL is held: ctypes.pythonapi
    is a PyDLL, so no thread can come or go meanwhile). The two words read
    from each tstate are read directly (ctypes, ~0.2 us) once the layout is
    verified: the pointers come from the API and the offsets have passed
    the checks; `safe` reads them through `mem` instead (before that)."""
    api = _api()
    interp = api.PyInterpreterState_Head()
    out = []
    ts = api.PyInterpreterState_ThreadHead(interp) if interp else None
    by_ident = None
    if safe:
        u64 = mem.u64
    else:

        def u64(addr):
            return ctypes.c_uint64.from_address(addr).value

    off_ident = layout["ts_thread_id"]
    off_native = layout["ts_native_thread_id"]
    for _ in range(100000):
        if not ts:
            break
        ident = u64(ts + off_ident)
        if off_native != pyoffsets.NONE:
            native = u64(ts + off_native)
        else:
            if by_ident is None:
                by_ident = {t.ident: getattr(t, "native_id", None) for t in threading.enumerate()}
            native = by_ident.get(ident)
        out.append((native, ts, ident))
        ts = api.PyThreadState_Next(ts)
    return out


def _frame_addr(mem, layout, tstate):
    f = mem.u64(tstate + layout["ts_frame"])
    if layout["cframe_frame"] != pyoffsets.NONE and f:
        f = mem.u64(f + layout["cframe_frame"])
    return f


def walk(mem, layout, tstate, limit=256):
    """[(code address, lasti in code units)] from the innermost frame out,
    exactly as the BPF program walks it (incomplete and shim frames skipped)."""
    code_type = id(types_code())
    out = []
    f = _frame_addr(mem, layout, tstate)
    kind = layout["frame_kind"]
    for _ in range(limit):
        if not f:
            break
        code = mem.u64(f + layout["f_code"])
        back = mem.u64(f + layout["f_back"])
        if code is None or back is None:
            raise ValueError("frame unreadable")
        if kind == pyoffsets.FRAME_OBJECT:
            lasti = mem.i32(f + layout["f_instr"])
            owner = 0
        else:
            owner = mem.u8(f + layout["f_owner"])
            instr = mem.u64(f + layout["f_instr"])
            lasti = (instr - code - layout["co_code_adaptive"]) // 2 if instr else -1
        if owner == layout["owner_cstack"] or mem.u64(code + layout["ob_type"]) != code_type:
            f = back
            continue
        if kind != pyoffsets.FRAME_OBJECT and owner != pyoffsets.OWNER_GENERATOR:
            ft = mem.i32(code + layout["co_firsttraceable"])
            if lasti < ft:
                f = back
                continue  # incomplete: pushed, not started
        out.append((code, lasti))
        f = back
    return out


def _python_view(frame):
    out = []
    while frame is not None:
        out.append((id(frame.f_code), frame.f_lasti // 2 if frame.f_lasti >= 0 else -1))
        frame = frame.f_back
    return out


def _park_c(ev, ready):
    ready.set()
    ev.wait(5)


def _park_b(ev, ready):
    _park_c(ev, ready)


def _park_a(ev, ready):
    _park_b(ev, ready)


def verify(mem, layout):
    """Raw walk == sys._current_frames() for every other thread with frames
    (a parked thread of our own, a -> b -> c -> Event.wait, guarantees one);
    returns (threads compared, frames compared). Our own thread is skipped:
    its frames move while it walks."""
    ev = threading.Event()
    ready = threading.Event()
    parked = threading.Thread(
        target=_park_a, args=(ev, ready), name="stallscope-pythreads-verify", daemon=True
    )
    parked.start()
    try:
        ready.wait(5)
        time.sleep(0.01)  # into the wait
        threads = thread_states(mem, layout, safe=True)
        frames = sys._current_frames()
        me = threading.get_ident()
        # our own frame (this function's) would hold the dict that holds it:
        # a reference cycle left to the engine's collector. Never keep it.
        frames.pop(me, None)
        nthreads = nframes = 0
        parked_ok = False
        for native, ts, ident in threads:
            if ident not in frames or ident == me:
                continue
            want = _python_view(frames[ident])
            got = walk(mem, layout, ts)
            if got != want:
                raise ValueError(
                    f"frame walk of thread {native} differs from sys._current_frames(): "
                    f"{len(got)} vs {len(want)} frames"
                )
            if ident == parked.ident:
                codes = [c for c, _ in got]
                parked_ok = all(id(f.__code__) in codes for f in (_park_a, _park_b, _park_c))
            nthreads += 1
            nframes += len(want)
        if not parked_ok:
            raise ValueError("the parked thread's frames were not found")
        return nthreads, nframes
    finally:
        frames = None  # other threads' frames: let them go now, by reference counting
        ev.set()
        parked.join()


class Introspector:
    """Layout (checked against this interpreter) and thread states; a
    refusal is `status` "refused: why", never an exception."""

    def __init__(self):
        self.mem = None
        self.layout = None
        self.notes = []
        self.status = "refused: not checked yet"
        self.verified = None
        try:
            self.mem = Mem()
            self.layout, self.notes = build_layout(self.mem)
            _check_objects(self.mem, self.layout)
            self.layout["gil_holder"], note = gil_holder_address(self.mem, self.layout)
            self.notes.append(note)
            self.layout["pthread_tid"] = pyoffsets.NONE
            if self.layout["ts_native_thread_id"] == pyoffsets.NONE:
                self.layout["pthread_tid"] = pthread_tid_offset(self.mem)
                self.notes.append(
                    f"libc tid offset in struct pthread: {self.layout['pthread_tid']}"
                )
            self.status = "ok"
        except ValueError as e:
            self.status = f"refused: {e}"
        except Exception as e:  # never let the helper break the process
            self.status = f"refused: helper error {type(e).__name__}: {e}"

    def threads(self):
        if self.status != "ok":
            return []
        return thread_states(self.mem, self.layout, safe=not self.verified)

    def list_into(self, buf, offset, limit):
        """Write a PYTHREAD record per thread state (tid known) into `buf`
        from `offset`, at most `limit`; returns (records, more left out).
        Walked under the GIL (pythonapi is a PyDLL): no thread comes or goes
        meanwhile. Two words per tstate, read directly: the pointers come
        from the C API and the offsets passed the checks."""
        api = _api()
        interp = api.PyInterpreterState_Head()
        ts = api.PyInterpreterState_ThreadHead(interp) if interp else None
        off_ident = self.layout["ts_thread_id"]
        off_native = self.layout["ts_native_thread_id"]
        by_ident = None
        if off_native == pyoffsets.NONE:  # 3.10: native ids from threading
            by_ident = {t.ident: getattr(t, "native_id", None) for t in threading.enumerate()}
        n = 0
        more = 0
        pack = wire.PYTHREAD_RECORD.pack_into
        rs = wire.RECORD_SIZE
        for _ in range(100000):
            if not ts:
                break
            if off_native != pyoffsets.NONE:
                native = ctypes.c_uint32.from_address(ts + off_native).value
            else:
                ident = ctypes.c_uint64.from_address(ts + off_ident).value
                native = by_ident.get(ident) or 0
            if native:
                if n < limit:
                    pack(buf, offset + n * rs, wire.REC_PYTHREAD, 0, 0, native, ts, 0, 0)
                    n += 1
                else:
                    more += 1
            ts = api.PyThreadState_Next(ts)
        if more:
            for i in range(n):
                buf[offset + i * rs + 1] = wire.PYTHREAD_MORE
        return n, more

    def check_frames(self):
        """Verify the frame offsets on the live threads (once is enough)."""
        if self.status != "ok" or self.verified:
            return
        try:
            self.verified = verify(self.mem, self.layout)
        except ValueError as e:
            self.status = f"refused: {e}"
        except Exception as e:
            self.status = f"refused: helper error {type(e).__name__}: {e}"


class Reporter:
    """The PYLAYOUT payload and the PYTHREADS datagrams of this process.

    Made lazily by the flusher (its set-up runs the checks above). `layout`
    is the JSON payload (bytes); `listing(now)` writes the current thread
    list into a preallocated datagram and returns the bytes to send, or
    None when it did not change since the last one `sent()`."""

    def __init__(self):
        t0 = time.monotonic_ns()
        self.intro = Introspector()
        self.intro.check_frames()
        self.cost_ns = time.monotonic_ns() - t0
        self.ok = self.intro.status == "ok"
        self._buf = bytearray(wire.DATAGRAM_MAX)
        self._last = b""
        self._pending = None
        self.listings = 0  # thread lists made (sent or not)
        self.layout = self._layout_payload()

    def _layout_payload(self):
        intro = self.intro
        info = {
            "status": intro.status,
            "version": list(sys.version_info[:3]),
            "hexversion": sys.hexversion,
            "implementation": sys.implementation.name,
            "free_threaded": free_threaded(),
            "machine": platform.machine(),
            "notes": intro.notes,
            "verified": list(intro.verified) if intro.verified else None,
            "mem_reader": intro.mem.method if intro.mem else None,
            "cost_ns": self.cost_ns,
        }
        if intro.status == "ok":
            info["layout"] = {k: v for k, v in intro.layout.items() if isinstance(v, int)}
            info["layout_source"] = intro.layout.get("source")
            info["types"] = {"code": id(types_code()), "str": id(str), "bytes": id(bytes)}
        return json.dumps(info, separators=(",", ":")).encode("utf-8", "replace")[: wire.HELLO_MAX]

    def listing(self, header):
        """The PYTHREADS datagram (bytes) if the thread list changed since
        the last `sent()`, else None; `header(count)` packs the header."""
        if not self.ok:
            return None
        self.listings += 1
        buf = self._buf
        n, more = self.intro.list_into(buf, wire.HEADER_SIZE, wire.MAX_RECORDS)
        body = bytes(buf[wire.HEADER_SIZE : wire.HEADER_SIZE + n * wire.RECORD_SIZE])
        if body == self._last:
            return None
        self._pending = body
        return bytes(header(n)) + body

    def sent(self):
        if self._pending is not None:
            self._last = self._pending
            self._pending = None

    def forget_sent(self):
        """A new connection: the next listing is sent whatever it holds."""
        self._last = b""
