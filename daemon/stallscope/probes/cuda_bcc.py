"""CUDA driver probe (bcc): host time of traced processes inside libcuda, by kind.

Loads `cuda_bcc.c` and attaches it as uprobes (entry) and uretprobes
(return) on the driver's exported launch (`cuLaunchKernel`,
`cuLaunchKernelEx`, `cuGraphLaunch`, ...), synchronisation
(`cuStreamSynchronize`, `cuEventSynchronize`, `cuCtxSynchronize`), query
(`cuEventQuery`, `cuStreamQuery`: polling loops) and copy (`cuMemcpy*`)
entry points, with every `_v2`/`_ptsz`/`_ptds` variant the library exports,
per traced process only (one uprobe_multi link per program and process,
released with one grace period; one uprobe per entry point on kernels
without such links): a process that is not traced never enters the
program. The library is the one the process maps (a `probes.cuda_library`
file in /proc/PID/maps), looked for again every `cuda_rescan_ms` until found
while the probe is attached (a diagnosis window; at the attach too),
and every DETACHED_RESCAN_S while it is not (nothing is recorded then; the
maps of a torch process are thousands of lines), so a driver dlopen'ed after
start is attached too (calls made before that rescan are not seen). A call of at least `cuda_threshold_us` is one exact
`cuda_calls` row named after its entry point; shorter calls are summed per
(thread, kind) in the kernel. Calls through pointers from `cuGetProcAddress`
reach the same entry points and are counted; cudart's private export tables
(`cuGetExportTable`) are not exported symbols and are missed
(docs/cuda-probe.md). A traced process without the library is left alone and
`status()` and probe_status say why the probe is idle for it. It must never
run Python per call.
"""

import ctypes as ct
import errno
import logging
import os
import platform
import re
import threading
import time

import numpy as np
import pyarrow as pa

from stallscope import threads
from stallscope.probes import bpf_common
from stallscope.probes.bpf_probe import BccTracepointProbe
from stallscope.probes.cpu_elf import MapsSymbolizer, _Module

log = logging.getLogger(__name__)

# The maps of a process that does not map the driver are read again this
# often while the probe is detached: only probe_status's "idle" line needs
# it then (0.16-0.2 % of a core went to 4 reads a second of one small
# process's maps, bench/daemon_footprint.py), and attach() rescans at once.
DETACHED_RESCAN_S = 5.0

# One uprobe per entry point and process closed slowly: the kernel waits a
# grace period for each perf event it releases, one at a time (~0.16 s on
# this VM: a real libcuda's ~180 uprobes and uretprobes took ~30 s to detach,
# trapping every launch of the engine meanwhile). A uprobe_multi link (Linux
# 6.6+) holds all of one program's uprobes in a process and is released with
# one grace period for all of them (20 uprobes: 35 ms against 3.2 s). Where
# the kernel has no such links, the probe attaches one uprobe per entry point.
BPF_LINK_CREATE = 28
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_TRACE_UPROBE_MULTI = 48
BPF_F_UPROBE_MULTI_RETURN = 1
_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280}.get(platform.machine())
# What a kernel without uprobe_multi links (or without this attach type for
# the program) answers: the probe then falls back for good.
_NO_MULTI_ERRNOS = {errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS, errno.E2BIG, 524}


class _UprobeMultiAttr(ct.Structure):
    """bpf_attr's link_create with its uprobe_multi member (linux/bpf.h)."""

    _fields_ = [
        ("prog_fd", ct.c_uint32),
        ("target_fd", ct.c_uint32),
        ("attach_type", ct.c_uint32),
        ("flags", ct.c_uint32),
        ("path", ct.c_uint64),
        ("offsets", ct.c_uint64),
        ("ref_ctr_offsets", ct.c_uint64),
        ("cookies", ct.c_uint64),
        ("cnt", ct.c_uint32),
        ("multi_flags", ct.c_uint32),
        ("pid", ct.c_uint32),
        ("_pad", ct.c_uint32),
    ]


class _UprobeMultiInfo(ct.Structure):
    """bpf_link_info with its uprobe_multi member (Linux 6.8+)."""

    _fields_ = [
        ("type", ct.c_uint32),
        ("id", ct.c_uint32),
        ("prog_id", ct.c_uint32),
        ("_pad", ct.c_uint32),
        ("path", ct.c_uint64),
        ("offsets", ct.c_uint64),
        ("ref_ctr_offsets", ct.c_uint64),
        ("cookies", ct.c_uint64),
        ("path_size", ct.c_uint32),
        ("count", ct.c_uint32),
        ("flags", ct.c_uint32),
        ("pid", ct.c_uint32),
    ]


_libc = ct.CDLL(None, use_errno=True)
_libc.syscall.restype = ct.c_long


def _bpf(cmd, attr):
    if _BPF_SYSCALL is None:
        raise OSError(errno.ENOSYS, f"no bpf syscall number known for {platform.machine()}")
    rc = _libc.syscall(_BPF_SYSCALL, cmd, ct.byref(attr), ct.sizeof(attr))
    if rc < 0:
        e = ct.get_errno()
        raise OSError(e, os.strerror(e))
    return rc


def link_uprobe_multi(prog_fd, path, offsets, pid, ret=False):
    """A uprobe_multi link of `prog_fd` on `offsets` (file offsets) of `path`
    in process `pid` (uretprobes with `ret`); its fd. OSError if refused."""
    offs = (ct.c_uint64 * len(offsets))(*offsets)
    cpath = ct.create_string_buffer(os.fsencode(path))
    attr = _UprobeMultiAttr(
        prog_fd=prog_fd,
        attach_type=BPF_TRACE_UPROBE_MULTI,
        path=ct.addressof(cpath),
        offsets=ct.addressof(offs),
        cnt=len(offsets),
        multi_flags=BPF_F_UPROBE_MULTI_RETURN if ret else 0,
        pid=pid,
    )
    return _bpf(BPF_LINK_CREATE, attr)


def uprobe_multi_link_info(fd):
    """(pid, number of uprobes) of a uprobe_multi link, as the kernel holds it."""
    info = _UprobeMultiInfo()

    class Attr(ct.Structure):
        _fields_ = [("bpf_fd", ct.c_uint32), ("info_len", ct.c_uint32), ("info", ct.c_uint64)]

    _bpf(BPF_OBJ_GET_INFO_BY_FD, Attr(fd, ct.sizeof(info), ct.addressof(info)))
    return info.pid, info.count


_KINDS = bpf_common.header_defines("cuda_bcc.h", "CU_KIND_")
KIND_NAMES = {
    _KINDS["CU_KIND_LAUNCH"]: "launch",
    _KINDS["CU_KIND_SYNC"]: "sync",
    _KINDS["CU_KIND_POLL"]: "poll",
    _KINDS["CU_KIND_COPY"]: "copy",
}
_VARIANT = r"(?:_v\d+)?(?:_ptsz|_ptds)?"
# entry point name -> the program function its uprobe runs
ENTRY_POINTS = (
    (
        re.compile(
            rf"cu(?:LaunchKernel|LaunchKernelEx|LaunchCooperativeKernel"
            rf"|LaunchCooperativeKernelMultiDevice|LaunchHostFunc|GraphLaunch){_VARIANT}"
        ),
        "on_launch",
    ),
    (re.compile(rf"cu(?:StreamSynchronize|EventSynchronize|CtxSynchronize){_VARIANT}"), "on_sync"),
    (re.compile(rf"cu(?:StreamQuery|EventQuery){_VARIANT}"), "on_query"),
    (re.compile(r"cuMemcpy\w*"), "on_copy"),
)


def entry_points(names):
    """{name: program function} of the exported names the probe attaches to."""
    out = {}
    for name in names:
        for pattern, fn in ENTRY_POINTS:
            if pattern.fullmatch(name):
                out[name] = fn
                break
    return out


def find_library(pid, prefix="libcuda.so", proc_root="/proc"):
    """The path of the first mapped file named `prefix`* in /proc/PID/maps, or None."""
    with open(f"{proc_root}/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            path = parts[5].rstrip("\n")
            if path.startswith("/") and os.path.basename(path).startswith(prefix):
                return path.removesuffix(" (deleted)")
    return None


def exported_functions(path):
    """Names of the functions `path` (an ELF shared library) defines."""
    return [n.decode(errors="replace") for n in _Module(path).names]


class BccCudaProbe(BccTracepointProbe):
    """Launches, synchronisations, polling loops and copies in libcuda of traced processes."""

    name = "cuda"
    source = "cuda_bcc.c"
    tracepoints = ()  # uprobes, attached per process
    record_fields = ("start_ns", "end_ns", "total_ns", "ip", "pid", "tid", "kind", "count", "calls")
    loss_reasons = {
        "reserve_failed": "CUDA ring buffer full: driver call rows dropped "
        "(raise kernel_ring_pages or cuda_threshold_us)",
        "aggs_full": "CUDA aggregate map full: short driver calls not counted "
        "(raise kernel_max_tids)",
        "inflight_full": "CUDA in-flight map full: driver calls not timed (raise kernel_max_tids)",
    }
    # Uprobes cost every probed call a trap (BENCHMARKS.md, bench/cuda_probe_cost.py):
    # over the 1% budget at 10^4 launches/s, so attached in diagnosis windows only.
    detachable = True

    def __init__(self, settings=None):
        super().__init__(settings)
        s = self.settings
        self.threshold_ns = int(float(s.cuda_threshold_us) * 1000)
        self.flush_ns = int(s.cuda_flush_ms * 1e6)
        self.poll_gap_ns = int(float(s.cuda_poll_gap_us) * 1000)
        self.rescan_s = s.cuda_rescan_ms / 1000.0
        self.library = s.cuda_library
        self.proc_root = s.proc_root
        self.sweep_s = max(self.poll_s, 0.1)
        self._last_sweep = 0.0
        self._ulock = threading.RLock()  # the per-process state below
        self._libs = {}  # pid -> {"path", "points": {name: fn}, "attached": [names]}
        self._idle = {}  # pid -> why the probe does nothing for it
        self._symbols = MapsSymbolizer(s.proc_root)
        self._names = {}  # (pid, ip) -> entry point name
        self._scan_stop = threading.Event()
        self._scan_wake = threading.Event()
        self._scanner = None
        self._closer = None  # the thread closing detached uprobes (slow: see _closing)
        self._to_close = []  # (bcc event name or None for a link, fd) waiting for it
        self._multi = None  # uprobe_multi links: None until the first attach tells
        self._close_lock = threading.Lock()
        self.attach_errors = 0

    def cflags(self):
        n = int(self.settings.kernel_max_tids)
        return [
            f"-DTHRESHOLD_NS={self.threshold_ns}",
            f"-DFLUSH_NS={self.flush_ns}",
            f"-DPOLL_GAP_NS={self.poll_gap_ns}",
            f"-DMAX_TIDS={n}",
            f"-DMAX_AGGS={n}",
        ]

    def _started(self):
        self._scan_stop.clear()
        self._scan_wake.clear()
        self._scanner = threading.Thread(target=self._scan_loop, name="stallscope-cuda-scan",
                                         daemon=True)  # fmt: skip
        self._scanner.start()

    def stop(self):
        self._scan_stop.set()
        self._scan_wake.set()
        if self._scanner is not None:
            self._scanner.join()
            self._scanner = None
        with self._ulock:
            events = []
            for pid in list(self._libs):
                events += self._take_events(pid)
            self._closing(events, wait=True)
        super().stop()

    # -- which processes, which library ----------------------------------------------

    def track(self, pid):
        super().track(pid)
        if self._bpf is not None:
            self._scan(int(pid))

    def untrack(self, pid):
        pid = int(pid)
        super().untrack(pid)
        with self._ulock:
            self._detach_pid(pid)
            self._libs.pop(pid, None)
            self._idle.pop(pid, None)
            self._symbols.forget(pid)
            self._names = {k: v for k, v in self._names.items() if k[0] != pid}
        if self._bpf is not None:
            for name in (b"inflight", b"polls"):
                table = self._bpf[name]
                for key, value in table.items():
                    if value.pid == pid:
                        try:
                            del table[key]
                        except KeyError:
                            pass

    def _scan_loop(self):
        threads.background("cuda-scan")
        while True:
            # attach() and stop() wake it: the wait is long while detached
            self._scan_wake.wait(self._rescan_wait())
            self._scan_wake.clear()
            if self._scan_stop.is_set():
                return
            self._scan_missing()

    def _rescan_wait(self):
        return self.rescan_s if self._attached else max(self.rescan_s, DETACHED_RESCAN_S)

    def _scan_missing(self):
        for pid in [p for p in list(self._tracked) if p not in self._libs]:
            try:
                self._scan(pid)
            except Exception:  # a vanished process, a bad file: next time
                log.debug("cuda probe: scan of pid %d failed", pid, exc_info=True)

    def _scan(self, pid):
        """Look for the driver in `pid`'s maps; attach to it when found (and attached)."""
        with self._ulock:
            if pid in self._libs or pid not in self._tracked:
                return
            try:
                path = find_library(pid, self.library, self.proc_root)
            except OSError as exc:
                self._set_idle(pid, f"cannot read {self.proc_root}/{pid}/maps: {exc.strerror}")
                return
            if path is None:
                self._set_idle(
                    pid,
                    f"no {self.library}* mapped (looking again every "
                    f"{self.rescan_s * 1000:.0f} ms, cuda_rescan_ms, while attached; "
                    f"every {max(self.rescan_s, DETACHED_RESCAN_S):g} s while detached)",
                )
                return
            try:
                points = entry_points(exported_functions(path))
            except (OSError, ValueError) as exc:
                self._set_idle(pid, f"cannot read the symbols of {path}: {exc}")
                return
            if not points:
                self._set_idle(pid, f"{path} exports none of the probed entry points")
                return
            self._idle.pop(pid, None)
            self._libs[pid] = {"path": path, "points": points, "attached": [], "events": []}
            log.info("cuda probe: pid %d maps %s (%d entry points)", pid, path, len(points))
            if self._attached:
                self._attach_pid(pid)
            self._report()

    def _set_idle(self, pid, why):
        if self._idle.get(pid) != why:
            self._idle[pid] = why
            log.info("cuda probe: idle for pid %d: %s", pid, why)
            self._report()

    def _report(self):
        if self._sink is not None:
            state = "active" if self._libs else "idle"
            self._sink.status(self.name, self.backend, state, self.detail())

    def detail(self):
        """One line: what the probe does for each traced process."""
        with self._ulock:
            parts = [
                f"pid {pid}: {len(lib['points'])} entry points of {lib['path']}"
                + ("" if lib["attached"] else " (attached in diagnosis windows)")
                for pid, lib in sorted(self._libs.items())
            ]
            parts += [f"pid {pid}: idle, {why}" for pid, why in sorted(self._idle.items())]
        return "; ".join(parts) or "no traced process yet"

    # -- uprobes ---------------------------------------------------------------------

    def _attach_pid(self, pid):
        if self._multi is not False:
            try:
                self._attach_links(pid)
                self._multi = True
                return
            except OSError as exc:
                if self._multi or exc.errno not in _NO_MULTI_ERRNOS:
                    self.attach_errors += 1
                    log.warning("cuda probe: cannot attach to pid %d: %s", pid, exc)
                    return
                self._multi = False
                # the link-typed programs: bcc's own attach must load them again
                for fn in [f for _, f in ENTRY_POINTS] + ["on_return"]:
                    loaded = self._bpf.funcs.pop(fn.encode(), None)
                    if loaded is not None:
                        os.close(loaded.fd)
                log.info(
                    "cuda probe: no uprobe_multi links in this kernel (%s): one uprobe per "
                    "entry point instead (a detach then takes ~0.1 s per uprobe, in the background)",
                    exc,
                )
        self._attach_uprobes(pid)

    def _attach_links(self, pid):
        """One uprobe_multi link per program for `pid`, one for the returns."""
        lib = self._libs[pid]
        if lib["attached"]:
            return
        path = lib["path"].encode()
        offsets, failed = {}, []  # program -> {offset: name}
        for name, fn in sorted(lib["points"].items()):
            try:
                path, off = self._bpf._check_path_symbol(path, name.encode(), None, pid)
            except Exception as exc:
                failed.append(name)
                log.warning("cuda probe: cannot resolve %s in pid %d: %s", name, pid, exc)
                continue
            offsets.setdefault(fn, {}).setdefault(off, name)
        links = []
        try:
            every = sorted({o for by_off in offsets.values() for o in by_off})
            for fn, by_off in sorted(offsets.items()):
                prog = self._bpf.load_func(fn.encode(), self._bpf.KPROBE,
                                           attach_type=BPF_TRACE_UPROBE_MULTI)  # fmt: skip
                links.append(link_uprobe_multi(prog.fd, path, sorted(by_off), pid))
            if every:
                prog = self._bpf.load_func(b"on_return", self._bpf.KPROBE,
                                           attach_type=BPF_TRACE_UPROBE_MULTI)  # fmt: skip
                links.append(link_uprobe_multi(prog.fd, path, every, pid, ret=True))
        except Exception:
            for fd in links:
                os.close(fd)
            raise
        self.attach_errors += len(failed)
        # an alias of another name's offset is probed too, by that uprobe
        lib["attached"] = [n for n in sorted(lib["points"]) if n not in failed]
        lib["events"] += links
        log.info(
            "cuda probe: pid %d: %d entry points attached (%d uprobe_multi links)",
            pid,
            len(lib["attached"]),
            len(links),
        )

    def _attach_uprobes(self, pid):
        lib = self._libs[pid]
        path = lib["path"].encode()
        for name, fn in sorted(lib["points"].items()):
            if name in lib["attached"]:
                continue
            before = set(self._bpf.uprobe_fds)
            try:
                self._bpf.attach_uprobe(name=path, sym=name.encode(), fn_name=fn.encode(), pid=pid)
                try:
                    self._bpf.attach_uretprobe(
                        name=path, sym=name.encode(), fn_name=b"on_return", pid=pid
                    )
                except Exception:
                    self._bpf.detach_uprobe(name=path, sym=name.encode(), pid=pid)
                    raise
            except Exception as exc:
                self.attach_errors += 1
                log.warning("cuda probe: cannot attach %s in pid %d: %s", name, pid, exc)
                continue
            lib["attached"].append(name)
            # bcc's event names, to detach by: resolving the symbol again
            # fails once the process is gone
            lib["events"] += [e for e in self._bpf.uprobe_fds if e not in before]
        log.info("cuda probe: pid %d: %d entry points attached", pid, len(lib["attached"]))

    def held_uprobes(self):
        """{pid: uprobes (entry and return)} as the kernel holds them for the
        probe now: each uprobe_multi link's pid and count read back from the
        kernel, bcc's uprobes by their event names."""
        held = {}
        with self._ulock, self._close_lock:
            events = [ev for lib in self._libs.values() for ev in lib["events"]]
            events += list(self._bpf.uprobe_fds) if self._bpf is not None else []
            # detached but not closed yet: the kernel still holds (and traps on) them
            events += [fd if ev is None else ev for ev, fd in self._to_close]
        for ev in dict.fromkeys(events):  # bcc's own list has the names of lib["events"] too
            if isinstance(ev, int):
                try:
                    pid, count = uprobe_multi_link_info(ev)
                except OSError:  # closed meanwhile
                    continue
            else:
                pid, count = int(ev.rsplit(b"_", 1)[1]), 1
            held[pid] = held.get(pid, 0) + count
        return held

    def _take_events(self, pid):
        """The bcc events of `pid`'s uprobes (or its links' fds), forgotten as attached."""
        lib = self._libs.get(pid)
        if lib is None:
            return []
        events, lib["events"], lib["attached"] = lib["events"], [], []
        return events

    def _detach_pid(self, pid):
        if self._bpf is not None:
            self._closing(self._take_events(pid))

    def _closing(self, events, wait=False):
        """Detach `events` (links' fds, bcc's uprobe events): forgotten here,
        closed by one background thread, in order (each close costs the
        kernel a grace period, ~0.1 s on this VM, and they do not overlap;
        a link is one close for all its uprobes), so the caller (the
        daemon's loop, ingest) never waits for it unless `wait`.
        The program is gated by the `tracked` map, so a uprobe not yet
        closed records nothing."""
        with self._close_lock:
            for ev in events:
                if isinstance(ev, int):  # a uprobe_multi link's fd
                    self._to_close.append((None, ev))
                    continue
                fd = self._bpf.uprobe_fds.get(ev)
                if fd is not None:
                    self._bpf._del_uprobe_fd(ev)
                    self._to_close.append((ev, fd))
            if self._to_close and self._closer is None:
                self._closer = threading.Thread(
                    target=self._close_events, name="stallscope-cuda-detach", daemon=True
                )
                self._closer.start()
            closer = self._closer
        if wait and closer is not None:
            closer.join()

    def _close_events(self):
        from bcc import lib as bcc_lib

        threads.background("cuda-detach")
        while True:
            with self._close_lock:
                if not self._to_close:
                    self._closer = None
                    return
                ev, fd = self._to_close[0]  # listed until closed (held_uprobes)
            try:
                if ev is None:
                    os.close(fd)
                else:
                    bcc_lib.bpf_close_perf_event_fd(fd)
                    bcc_lib.bpf_detach_uprobe(ev)
            except Exception as exc:  # already gone: nothing to stop
                log.debug("cuda probe: detach %s: %s", ev, exc)
            with self._close_lock:
                self._to_close.pop(0)

    def attach(self):
        if self._bpf is None or self._attached:
            return
        with self._ulock:
            self._attached = True
            for pid in list(self._tracked):
                self._load_tracked(pid)
            for pid in list(self._libs):
                self._attach_pid(pid)
            self._scan_wake.set()  # the scanner looks now, then at cuda_rescan_ms
            self._report()

    def detach(self):
        if self._bpf is None or not self._attached:
            return
        with self._ulock:
            # nothing is recorded from here on: the program's filter is empty
            # while the uprobes are closed behind it
            self._bpf[b"tracked"].clear()
            events = []
            for pid in list(self._libs):
                events += self._take_events(pid)
            self._attached = False
            self._closing(events)
        # calls in flight at the detach must not pair with a return seen
        # after the next attach
        self._bpf[b"inflight"].clear()
        self._bpf[b"polls"].clear()
        self._bpf[b"phase"].clear()
        self.drain(final=True)
        self._report()

    # -- rows --------------------------------------------------------------------------

    def _name(self, pid, ip):
        key = (pid, ip)
        if key not in self._names:
            name, _ = self._symbols.resolve(pid, ip)
            if name is None and not self._symbols.mapped(pid, ip):
                # a library mapped since the maps were read
                name, _ = self._symbols.resolve(pid, ip, refresh=True)
            if len(self._names) > 4096:
                self._names.clear()
            self._names[key] = name.decode(errors="replace") if name else None
        return self._names[key]

    def _rows(self, pid, tid, kind, ip, start, end, count, total, calls):
        pid = np.asarray(pid, dtype=np.int32)
        ip = np.asarray(ip, dtype=np.uint64)
        names = [self._name(int(p), int(i)) if i else None for p, i in zip(pid, ip, strict=True)]
        return {
            "pid": pid,
            "tid": np.asarray(tid, dtype=np.int32),
            "kind": pa.array([KIND_NAMES.get(int(k), "?") for k in kind], type=pa.string()),
            "name": pa.array(names, type=pa.string()),
            "start_ns": np.asarray(start, dtype=np.int64),
            "end_ns": np.asarray(end, dtype=np.int64),
            "count": np.asarray(count, dtype=np.int32),
            "total_ns": np.asarray(total, dtype=np.int64),
            "calls": np.asarray(calls, dtype=np.int32),
        }

    def _emit(self, recs):
        self._append(
            "cuda_calls",
            self._rows(recs["pid"], recs["tid"], recs["kind"], recs["ip"], recs["start_ns"],
                       recs["end_ns"], recs["count"], recs["total_ns"], recs["calls"]),
        )  # fmt: skip

    def _sweep(self, now_ns, final=False):
        now = time.monotonic()
        if not final and now - self._last_sweep < self.sweep_s:
            return
        self._last_sweep = now
        got = self.sweep_aggregates("aggs", self.flush_ns, now_ns, final)
        if got:
            self._append(
                "cuda_calls",
                self._rows([v.pid for _, v in got], [k.tid for k, _ in got],
                           [k.kind for k, _ in got], [0] * len(got),
                           [v.start_ns for _, v in got], [v.last_ns for _, v in got],
                           [v.count for _, v in got], [v.total_ns for _, v in got],
                           [v.calls for _, v in got]),
            )  # fmt: skip

    def status(self):
        out = super().status()
        out["threshold_us"] = self.threshold_ns / 1000
        out["library"] = self.library
        out["attach_errors"] = self.attach_errors
        with self._ulock:
            out["processes"] = {
                str(pid): {"library": lib["path"], "entry_points": len(lib["points"]),
                           "attached": len(lib["attached"])}
                for pid, lib in self._libs.items()
            }  # fmt: skip
            out["idle"] = {str(pid): why for pid, why in self._idle.items()}
        return out
