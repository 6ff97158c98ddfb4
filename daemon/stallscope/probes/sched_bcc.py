"""eBPF scheduling probe (bcc): event-exact off-CPU, run-queue and migration rows.

Threads that never emit a span (pool workers) are summarised in the kernel
into `sched_summary` rows unless `sched_detail` is set (sched_summary.py);
the threads that run steps always keep event-exact rows.

Loads `sched_bcc.c` (tracepoints sched_switch, sched_wakeup, sched_wakeup_new,
sched_migrate_task, task_newtask, sched_process_exit), filtered in the kernel
to the tgids given to `track()`, paired in the kernel per thread, and reads
the BPF ring buffer itself: the ring is mmapped and drained by one reader
thread every `sched_poll_ms` as a numpy structured array, so the cost per
event in user space is a vector slice, not a Python callback. Timestamps are
`bpf_ktime_get_ns()`, i.e. CLOCK_MONOTONIC, the clock of `time.monotonic_ns()`.
It must never read a `task_struct` field (headers may not match the running
kernel) and never call into Python per event. A preempted switch-out inside
`sched_yield()` (the thread gave its CPU away itself) is told from a real
preemption by the system call the thread is in (its saved registers) and
written as `offcpu.yielded` (NULL on an architecture this module does not
know, or a kernel without `bpf_task_pt_regs`, before Linux 5.15).
"""

import collections
import logging
import os
import threading
import time

import numpy as np

from stallscope import gaps, threads
from stallscope.probes import bpf_common, gap_kicks
from stallscope.probes.base import Probe, ReaderPark
from stallscope.probes.sched_resolve import TgidResolver, who_columns
from stallscope.probes.sched_summary import ThreadSummaries

log = logging.getLogger(__name__)

TRACEFS = bpf_common.TRACEFS
TRACEPOINTS = (
    "sched:sched_switch",
    "sched:sched_waking",
    "sched:sched_wakeup",
    "sched:sched_wakeup_new",
    "sched:sched_migrate_task",
    "sched:sched_process_exit",
    "task:task_newtask",
    "irq:irq_handler_entry",
    "irq:irq_handler_exit",
    "irq:softirq_entry",
    "irq:softirq_exit",
    "timer:hrtimer_expire_entry",
    "timer:hrtimer_expire_exit",
)
# Record kinds, read from the header (values, not layout: no map shows them).
_KINDS = bpf_common.header_defines("sched_bcc.h", "KIND_")
KIND_SWITCH_IN = _KINDS["KIND_SWITCH_IN"]
KIND_MIGRATE = _KINDS["KIND_MIGRATE"]
RECORD_FIELDS = (
    "a_ns", "b_ns", "c_ns", "pid", "tid", "cpu_a", "cpu_b", "kind", "preempted", "yielded",
    "other_irq", "other_tid", "other_pid", "other_comm", "prev_pid", "prev_run_ns", "prev_comm",
)  # fmt: skip
LOSS_REASONS = {
    "reserve_failed": "ring buffer full: records dropped in the kernel "
    "(raise sched_ring_pages or lower sched_poll_ms)",
    "state_full": "per-thread state map full: intervals lost (raise sched_max_tids)",
    "lost_in_preempted": "switch-in not reported by the kernel: one preempted "
    "off-CPU interval lost",
    "lost_in_voluntary": "switch-in not reported by the kernel: one blocked off-CPU interval lost",
    "recursion_misses": "tracepoint runs skipped by the kernel while another BPF "
    "program ran on the CPU: events of unknown kind lost",
}


# __NR_sched_yield by architecture, for the programs that read the system
# call a thread is in from its saved registers (pt_regs.orig_ax: x86-64's
# layout only). Elsewhere offcpu.yielded is NULL.
YIELD_NR = {"x86_64": 24}


def yield_cflags():
    """The -D flag naming sched_yield's number ([]: not known here)."""
    nr = YIELD_NR.get(os.uname().machine)
    return [] if nr is None else [f"-DYIELD_NR={nr}"]


def _has_bpf_privileges():
    return bpf_common.has_bpf_privileges()


# How often summarised threads' sched_summary rows are taken: every
# sched_summary_ms or this, whichever is longer. Taking them reads the
# mmapped `summaries` array, not the ring: the ring keeps its own cadence
# (up to 1 s apart while reads come back small).
SUMMARY_READ_S = 0.2


class BccSchedProbe(Probe):
    """Kernel scheduling events of tracked processes through eBPF (bcc)."""

    name = "sched"
    backend = "bcc"

    @classmethod
    def unavailable(cls, settings=None):
        return bpf_common.bcc_unavailable(
            TRACEPOINTS, tracefs=TRACEFS, privileged=_has_bpf_privileges()
        )

    def __init__(self, settings=None):
        super().__init__(settings)
        self.max_tids = int(self.settings.sched_max_tids)
        self.max_tgids = int(self.settings.sched_max_tgids)
        # ring size in pages, a power of two; 4 MiB holds ~87k records, i.e.
        # 0.4 s of 200k events/s between two polls.
        self.ring_pages = int(self.settings.sched_ring_pages)
        self.poll_s = self.settings.sched_poll_ms / 1000.0
        self.proc_root = self.settings.proc_root
        self._bpf = None
        self._sink = None
        self._lock = threading.Lock()  # one drainer at a time
        # What the main loop changes under the lock (verification bases, the
        # summaries' threads) is queued here and applied by the lock's next
        # holder: the reader holds it through a drain, at idle priority, and
        # the main loop must never wait for that (a client's track() waited
        # seconds behind a drain on a host whose CPUs were all busy).
        self._pending = collections.deque()
        self._stop = threading.Event()
        self._park = ReaderPark()  # the reader sleeps while nothing is tracked
        self._thread = None
        self._tracked = set()
        self._records = 0
        self._rows = {"offcpu": 0, "runq": 0, "migrations": 0}
        self._lost_seen = dict.fromkeys(LOSS_REASONS, 0)
        self._lost_since_ns = self._recursion_since_ns = time.monotonic_ns()
        self._reader_cpu_ns = 0
        self._drains = 0
        self._started_ns = 0
        self._ring = None
        self._counters = None
        self._gaps = None  # the gap clock of the loaded program (stallscope/gaps.py)
        self._resolver = TgidResolver(self.proc_root)
        self.verify_s = self.settings.sched_verify_ms / 1000.0
        self._verify_base = {}  # (pid, tid) -> (proc_vol, proc_inv, bpf_vol, bpf_inv)
        self._unseen = {}  # tid -> [vol, inv] switch-outs the kernel made, we did not see
        self._last_verify = 0.0
        self.exact_all = bool(self.settings.sched_detail)
        self.summary = None  # ThreadSummaries while loaded, unless sched_detail
        self._step_threads = {}  # pid -> tids that emitted spans (kept across a reload)
        self.yields_known = False  # offcpu.yielded written (yield_cflags found the syscall)

    # -- lifecycle -------------------------------------------------------------

    def start(self, sink):
        if self._bpf is not None:
            return
        pages = self.ring_pages
        if pages & (pages - 1):
            raise ValueError(f"sched_ring_pages must be a power of two, not {pages}")
        cflags = [
            f"-DMAX_SUMMARY={max(1, min(self.max_tids, 4096))}",
            f"-DMAX_TIDS={self.max_tids}",
            f"-DMAX_TGIDS={self.max_tgids}",
            f"-DRINGBUF_PAGES={pages}",
        ]
        yields = yield_cflags()
        try:
            self._bpf = bpf_common.compile_program("sched_bcc.c", cflags + yields)
        except Exception as exc:
            if not yields:
                raise
            # bpf_task_pt_regs or the BTF task pointer refused (a kernel
            # before 5.15): the probe runs without telling yields apart
            log.warning(
                "sched probe: yields not told from preemptions (%s); offcpu.yielded NULL", exc
            )
            yields = []
            self._bpf = bpf_common.compile_program("sched_bcc.c", cflags)
        self.yields_known = bool(yields)
        try:
            record = bpf_common.map_value_dtype(self._bpf, "layout_record")
            bpf_common.require_fields(record, RECORD_FIELDS, "sched_bcc.h struct record")
            self._ring = bpf_common.RingReader(
                self._bpf, "events", bpf_common.ring_record_dtype(record), pages
            )
            self._counters = bpf_common.Counters(self._bpf)
            bpf_common.require_fields(
                self._counters.dtype, list(LOSS_REASONS)[:-1], "sched_bcc.h struct counters"
            )
            if not self.exact_all:
                self.summary = ThreadSummaries(
                    self._bpf,
                    max(1, min(self.max_tids, 4096)),
                    self.settings.sched_summary_after_ms * 1e6,
                    self.settings.sched_summary_ms * 1e6,
                )
                for pid, tids in self._step_threads.items():
                    self.summary.step_threads(pid, tids, time.monotonic_ns())
        except Exception:
            self._bpf.cleanup()
            self._bpf = None
            raise
        self._sink = sink
        if self.settings.sched_gap_clock:
            try:
                self._gaps = gap_kicks.GapClock(self._bpf)
                gaps.install(self._gaps)
            except Exception as exc:  # the probe runs on; the daemon wakes on timers
                log.warning("sched probe: no gap clock, periodic work wakes on timers (%s)", exc)
        self._started_ns = time.monotonic_ns()
        self._lost_since_ns = self._recursion_since_ns = self._started_ns
        for pid in list(self._tracked):
            self._load_tracked(pid)
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._reader, name="stallscope-sched-bcc", daemon=True
        )
        self._thread.start()
        log.info(
            "sched probe: bcc backend loaded (ring %d KiB, poll %.0f ms)",
            pages * bpf_common.PAGE_SIZE // 1024,
            self.poll_s * 1000,
        )

    def stop(self):
        if self._bpf is None:
            return
        self._stop.set()
        if self._gaps is not None:
            gaps.uninstall(self._gaps)  # its waiters wake now, not at their hard limit
            st = self._gaps.status()
            log.info(
                "sched probe: gap clock: %d of %d periodic waits ended in a gap a traced "
                "thread left (%d kicks); the rest at their limit or early",
                st["woken"],
                st["asked"],
                st["kicks"],
            )
            self._gaps = None
        self._park.wake()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.drain()
        self._check_losses()
        with self._lock:
            self._read_summaries(force=True)
            self._ring.close()
            self._counters.close()
            self._ring = None
            if self.summary is not None:
                self.summary.close()
                self.summary = None
        self._bpf.cleanup()
        self._bpf = None

    # -- who is followed -------------------------------------------------------

    def track(self, pid):
        pid = int(pid)
        self._tracked.add(pid)
        self._park.followed(len(self._tracked))
        if self._bpf is not None:
            self._load_tracked(pid)

    def _load_tracked(self, pid):
        import ctypes as ct

        # Mark the tgid first: from then on task_newtask records new threads,
        # so the /proc scan below cannot miss one created in between.
        self._bpf[b"tracked"][ct.c_uint32(pid)] = ct.c_uint8(1)
        tid_map = self._bpf[b"tid_tgid"]
        try:
            tids = os.listdir(f"{self.proc_root}/{pid}/task")
        except OSError:
            log.info("sched probe: process %d is gone; tracking it anyway", pid)
            return
        for tid in tids:
            tid_map[ct.c_uint32(int(tid))] = ct.c_uint32(pid)
        # The /proc verification counts from now, not from its first pass
        # (up to sched_verify_ms later): a switch the kernel drops in a
        # process's first second is reported too.
        state = self._bpf[b"state"]
        bases = {}
        for tid in tids:
            reading = self._switch_reading(state, pid, int(tid))
            if reading is not None:
                bases[(pid, int(tid))] = reading
        self._later(lambda: self._verify_base.update(bases))

    def untrack(self, pid):
        import ctypes as ct

        pid = int(pid)
        self._tracked.discard(pid)
        self._park.followed(len(self._tracked))
        self._step_threads.pop(pid, None)
        now = time.monotonic_ns()

        def forget():
            for key in [k for k in self._verify_base if k[0] == pid]:
                del self._verify_base[key]
            if self.summary is not None:
                self.summary.forget(pid, now)

        # Its last ring records and its summarised threads' final rows are
        # read now, not after the reader's next wait (up to 1 s): _later
        # hurries the reader.
        self._later(forget)
        if self._bpf is None:
            return
        try:
            del self._bpf[b"tracked"][ct.c_uint32(pid)]
        except KeyError:
            pass
        for name in ("tid_tgid", "state"):
            table = self._bpf[name.encode()]
            stale = [
                k for k, v in table.items() if (v.value if name == "tid_tgid" else v.pid) == pid
            ]
            for k in stale:
                try:
                    del table[k]
                except KeyError:
                    pass

    def detail_threads(self, pid, tids):
        """Threads `tids` of `pid` emitted spans: they keep event-exact rows."""
        self._step_threads.setdefault(int(pid), set()).update(int(t) for t in tids)
        pid, tids, now = int(pid), [int(t) for t in tids], time.monotonic_ns()

        def keep():
            if self.summary is not None:
                self.summary.step_threads(pid, tids, now)

        self._later(keep)

    def _later(self, change):
        """`change()` run by the lock's next holder (the reader, hurried now),
        in the order asked; the caller does not wait."""
        self._pending.append(change)
        self._park.hurry()

    def _run_pending(self):
        """The queued changes, the lock held."""
        while self._pending:
            change = self._pending.popleft()
            try:
                change()
            except Exception:
                log.exception("sched probe: a queued change failed")

    def _read_summaries(self, force=False):
        """sched_summary rows, every sched_summary_ms (the lock held)."""
        now = time.monotonic_ns()
        if self.summary is None or not (force or self.summary.due(now)):
            return
        root = self.proc_root
        cols = self.summary.read(now, lambda p, t: os.path.exists(f"{root}/{p}/task/{t}"))
        if cols is not None:
            self._sink.append("sched_summary", cols)

    # -- reading the ring ------------------------------------------------------

    def _reader(self):
        ring = self._ring
        # A ring more than half full raises the reader to normal priority
        # until it is drained (the reader itself, threads.keep_up, or the main
        # loop, threads.check_backlogs; the main loop lowers it again).
        threads.background("sched-reader", backlog=ring.fill, hurry=self._park.hurry)
        t_cpu = time.thread_time_ns()
        cadence = bpf_common.Cadence(self.poll_s)
        drain_at = time.monotonic() + self.poll_s
        wait_s = self.poll_s
        while not self._park.wait(self._stop, wait_s):
            try:
                now = time.monotonic()
                # The ring is read at its own cadence (up to 1 s apart while
                # reads come back small: a read's fixed cost, ~1-2 ms of numpy
                # and Arrow, is paid per read), or at once when it fills
                # (hurry() ends the wait). The summarised threads' rows keep
                # their period between reads of the ring (the views split a
                # row's time over steps): taking them costs no ring read.
                threads.keep_up()
                level = ring.fill()
                if self._pending:  # the main loop's changes (_later), without a read
                    with self._lock:
                        self._run_pending()
                if now >= drain_at or level > threads.HURRY_ABOVE:
                    drain_at = now + cadence.next(self.drain())
                    # The kernel's per-program recursion counts are one
                    # fdinfo file per program (13): read with the /proc
                    # verification, not with every drain (that was a third
                    # of the reader's CPU).
                    slow = time.monotonic() - self._last_verify >= self.verify_s
                    self._check_losses(recursion=slow)
                    if slow:
                        self.verify()
                wait_s = drain_at - now
                if self.summary is not None and self.summary.slots:
                    with self._lock:
                        self._run_pending()
                        self._read_summaries()
                        if self.summary is not None:
                            period = max(SUMMARY_READ_S, self.summary.interval_ns / 1e9)
                            due = self.summary.last_read_ns / 1e9 + period - now
                            wait_s = min(wait_s, due)
                wait_s = max(wait_s, 0.001)
            except Exception:  # a failing sink must not kill the reader
                log.exception("sched probe: reader error")
                wait_s = self.poll_s
            now_cpu = time.thread_time_ns()
            self._reader_cpu_ns += now_cpu - t_cpu
            t_cpu = now_cpu

    def drain(self):
        """Decode and hand to the sink everything committed so far; returns records."""
        with self._lock:
            self._run_pending()
            if self._ring is None:
                return 0
            recs = self._ring.read()
            self._drains += 1
            if len(recs):
                self._records += len(recs)
                self._emit(recs)
                if self.summary is not None:
                    self.summary.seen(recs["pid"], recs["tid"], time.monotonic_ns())
            self._read_summaries()  # and the threads seen may be summarised from now
            return len(recs)

    def _emit(self, recs):
        sink = self._sink
        sw = recs[recs["kind"] == KIND_SWITCH_IN]
        if len(sw):
            off = sw[sw["a_ns"] != 0]
            if len(off):
                sink.append(
                    "offcpu",
                    {
                        "pid": off["pid"].astype(np.int32),
                        "tid": off["tid"].astype(np.int32),
                        "start_ns": off["a_ns"].astype(np.int64),
                        "end_ns": off["c_ns"].astype(np.int64),
                        "preempted": off["preempted"].astype(bool),
                        # absent (NULL) where yields are not told apart
                        **({"yielded": off["yielded"].astype(bool)} if self.yields_known else {}),
                        "cpu": off["cpu_a"].astype(np.int16),
                        **who_columns(off, self._resolver),
                    },
                )
                self._rows["offcpu"] += len(off)
            rq = sw[sw["b_ns"] != 0]
            if len(rq):
                sink.append(
                    "runq",
                    {
                        "pid": rq["pid"].astype(np.int32),
                        "tid": rq["tid"].astype(np.int32),
                        "start_ns": rq["b_ns"].astype(np.int64),
                        "end_ns": rq["c_ns"].astype(np.int64),
                        "cpu": rq["cpu_b"].astype(np.int16),
                    },
                )
                self._rows["runq"] += len(rq)
        mig = recs[recs["kind"] == KIND_MIGRATE]
        if len(mig):
            sink.append(
                "migrations",
                {
                    "pid": mig["pid"].astype(np.int32),
                    "tid": mig["tid"].astype(np.int32),
                    "ts_ns": mig["a_ns"].astype(np.int64),
                    "from_cpu": mig["cpu_a"].astype(np.int16),
                    "to_cpu": mig["cpu_b"].astype(np.int16),
                },
            )
            self._rows["migrations"] += len(mig)

    def program_stats(self):
        return bpf_common.program_stats(self._bpf)

    def _check_losses(self, recursion=True):
        if self._bpf is None:
            return
        now = time.monotonic_ns()
        counts = self._counters.read()
        if recursion:
            counts["recursion_misses"] = sum(
                s.get("recursion_misses", 0) for s in self.program_stats().values()
            )
        else:
            counts["recursion_misses"] = self._lost_seen["recursion_misses"]
        for key, reason in LOSS_REASONS.items():
            delta = counts[key] - self._lost_seen[key]
            if delta > 0:
                since = self._recursion_since_ns if key == "recursion_misses" else None
                since = self._lost_since_ns if since is None else since
                self._sink.loss("sched", since, now, int(delta), reason)
                self._lost_seen[key] = counts[key]
        self._lost_since_ns = now
        if recursion:
            self._recursion_since_ns = now

    def verify(self):
        """Compare per-thread switch-out counts seen in BPF with the kernel's.

        The kernel can skip a tracepoint's BPF program without counting a
        miss (e.g. perf's recursion guard while other tracing runs on the
        CPU); nvcsw/nivcsw in /proc status count every switch. A deficit
        is written as a loss and kept per thread in status()["unseen"].
        Returns the switch-outs found missing in this pass."""
        with self._lock:
            self._run_pending()
            return self._verify()

    def _verify(self):
        self._last_verify = time.monotonic()
        if self._bpf is None:
            return 0
        state = self._bpf[b"state"]
        now = time.monotonic_ns()
        found = 0
        for pid in list(self._tracked):
            try:
                tids = [int(t) for t in os.listdir(f"{self.proc_root}/{pid}/task")]
            except OSError:
                continue
            for gone in [k for k in self._verify_base if k[0] == pid and k[1] not in tids]:
                del self._verify_base[gone]
            for tid in tids:
                reading = self._switch_reading(state, pid, tid)
                if reading is None:
                    continue
                vol, inv, n_vol, n_inv = reading
                base = self._verify_base.get((pid, tid))
                self._verify_base[(pid, tid)] = reading
                if base is None:
                    continue
                miss_v = (vol - base[0]) - ((n_vol - base[2]) & 0xFFFFFFFF)
                miss_i = (inv - base[1]) - ((n_inv - base[3]) & 0xFFFFFFFF)
                for i, miss, kind in ((0, miss_v, "voluntary"), (1, miss_i, "preempted")):
                    if miss > 0:
                        self._unseen.setdefault(tid, [0, 0])[i] += miss
                        found += miss
                        self._sink.loss(
                            "sched",
                            now,
                            now,
                            int(miss),
                            f"{kind} switch-outs of tid {tid} the kernel made but "
                            f"the tracepoint did not report (dropped by the kernel)",
                        )
        return found

    def _switch_reading(self, state, pid, tid):
        """(voluntary, nonvoluntary switches in /proc, switch-outs the program
        saw) of one thread, read together; None when it switched meanwhile or
        is gone. A thread the program has not met yet (no `state` entry) saw
        0: its entry starts at 0 at its first event since the process was
        marked tracked."""
        import ctypes as ct

        key = ct.c_uint32(tid)
        try:
            a = state.get(key)
            with open(f"{self.proc_root}/{pid}/task/{tid}/status", "rb") as f:
                text = f.read()
            b = state.get(key)
        except OSError:
            return None
        seen_a = (a.n_vol, a.n_inv) if a is not None else (0, 0)
        seen_b = (b.n_vol, b.n_inv) if b is not None else (0, 0)
        if seen_a != seen_b:
            return None  # it switched meanwhile: next pass
        try:
            vol = int(text.split(b"\nvoluntary_ctxt_switches:")[1].split()[0])
            inv = int(text.split(b"nonvoluntary_ctxt_switches:")[1].split()[0])
        except (IndexError, ValueError):
            return None
        return (vol, inv, *seen_b)

    def status(self):
        return {
            "backend": self.backend,
            "resolution_ns": 0,  # event-exact
            "yields_known": self.yields_known,
            "tracked": sorted(self._tracked),
            "records": self._records,
            "rows": dict(self._rows),
            "lost_reserve": self._lost_seen["reserve_failed"],
            "lost_state_full": self._lost_seen["state_full"],
            # preempted, voluntary
            "lost_switch_in": (
                self._lost_seen["lost_in_preempted"],
                self._lost_seen["lost_in_voluntary"],
            ),
            "lost_recursion": self._lost_seen["recursion_misses"],
            "reader_cpu_ns": self._reader_cpu_ns,
            "drains": self._drains,
            "unseen": {tid: tuple(v) for tid, v in self._unseen.items()},
            "poll_ms": self.poll_s * 1000,
            "summarised_tids": sorted(self.summary.slots) if self.summary is not None else [],
            "summary_rows": self.summary.rows if self.summary is not None else 0,
            "ring_bytes": self.ring_pages * bpf_common.PAGE_SIZE,
            "gap_clock": self._gaps.status() if self._gaps is not None else None,
        }
