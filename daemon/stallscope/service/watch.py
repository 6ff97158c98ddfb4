"""Processes followed with no probe client: `--pid` at start and WATCH requests while running.

GC passes of a process that imports nothing of ours come from CPython's
USDT markers (probes/gc_usdt.py). This module owns that probe for the
daemon: it follows the `--pid` processes at start-up, and it answers the
WATCH datagram `stallscope run --no-client` sends while the command it
started is held at its exec (wire.py: a connection without HELLO, a JSON
{pid, label}). A WATCH is honoured only for a process of the requester's
own uid (root may ask for any), as the kernel says (SO_PEERCRED and
/proc), and answered once the markers are live, so the held process
misses no pass. Compiling the program takes seconds: it runs on a thread
of its own, never on the ingest loop, and the scheduling probes start
following the pid from the daemon's main loop (`tick()`), like a client's.
When a followed process exits, its run gets `ended_ns`. Never stops,
signals or reads the memory of a process itself (bcc raises the markers'
semaphores), and a bad request costs only its own answer.
"""

import json
import logging
import threading
import time

from probe_client import wire
from stallscope import threads
from stallscope.ingest.requests import owner_uid
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

# WATCH requests being compiled at once; more are refused (`busy`), so a
# flood of requests cannot pile up compilers in the daemon.
MAX_PENDING = 4


class PidWatcher:
    def __init__(self, daemon):
        self.daemon = daemon
        self.settings = daemon.settings
        self.store = daemon.store
        self.probe = None  # the UsdtGcProbe, started at the first process followed
        self._lock = threading.Lock()
        self._pending = 0
        self._tracks = []  # (pid, run_id) for the main loop to hand to the other probes
        self._ends = []  # (pid, run_id, ended_ns) likewise
        self._live = set()  # run_ids handed to the other probes and not yet ended
        self._gone = set()  # run_ids that ended before the main loop saw them start

    # ----- the probe ---------------------------------------------------------------
    def _usdt(self):
        """The USDT GC probe, started on first use; None (reason stored) if it cannot run."""
        with self._lock:
            if self.probe is not None:
                return self.probe, None
            from stallscope.probes.gc_usdt import UsdtGcProbe

            reason = UsdtGcProbe.unavailable(self.settings)
            if reason is not None:
                self.store.record_probe_status("gc", None, "unavailable", reason)
                log.warning("gc probe unavailable: %s", reason)
                return None, reason
            probe = UsdtGcProbe(self.settings)
            probe.on_end = self._ended
            probe.start(self.daemon.sink)
            self.daemon.probes.append(probe)
            self.probe = probe
            return probe, None

    def _follow(self, pid, label):
        """Follow `pid`'s GC under a new run: (run_id, None) or (None, reason)."""
        from stallscope.probes.gc_usdt import command_line

        probe, reason = self._usdt()
        if probe is None:
            return None, reason
        if pid in probe.status()["pids"]:
            return None, f"pid {pid} is followed already"
        missing = probe.usdt_missing(pid, self.settings.proc_root)
        if missing is not None:
            self.store.record_probe_status("gc", "usdt", "unavailable", f"pid {pid}: {missing}")
            log.warning("gc probe: pid %d: %s", pid, missing)
            return None, missing
        argv = command_line(pid, self.settings.proc_root)
        label = label or " ".join(argv)[:120] or f"pid {pid}"
        run_id = self.daemon.ingest.external_run(pid, argv, label)
        try:
            probe.follow(pid, run_id)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            self.store.record_probe_status("gc", "usdt", "failed", f"pid {pid}: {reason}")
            log.error("gc probe: cannot follow pid %d: %s", pid, exc)
            self._ended(pid, run_id, time.monotonic_ns())
            return None, reason
        self.store.record_probe_status("gc", "usdt", "active", f"pid {pid}: run {run_id}")
        return run_id, None

    def follow_at_start(self, pids):
        """The `--pid` processes (already tracked by the other probes)."""
        for pid in sorted(pids):
            self._follow(pid, None)

    def _ended(self, pid, run_id, ended_ns):
        """From the probe's reader: the process exited (or a client took over)."""
        self.daemon.ingest.external_run_ended(run_id, ended_ns)
        with self._lock:
            self._ends.append((pid, run_id, ended_ns))

    # ----- WATCH requests ------------------------------------------------------------
    def request(self, conn, data):
        """A WATCH datagram on probe connection `conn` (the ingest loop's thread)."""
        try:
            info = json.loads(data[wire.HEADER_SIZE :].decode("utf-8"))
            pid = int(info["pid"]) if isinstance(info, dict) else None
            label = str(info.get("label") or "")[:200]
        except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
            pid = None
        if pid is None or not 0 < pid < 1 << 22:
            self.daemon.ingest._reject(None, conn.pid, "bad_watch")
            return self._answer(conn, {"ok": False, "reason": "bad request"})
        owner = owner_uid(pid, self.settings.proc_root)
        if owner is None:
            return self._answer(conn, {"ok": False, "reason": f"no process {pid}"})
        if conn.uid != 0 and owner != conn.uid:
            log.warning("refused WATCH of pid %d (uid %d) from uid %d", pid, owner, conn.uid)
            return self._answer(conn, {"ok": False, "reason": f"pid {pid} belongs to another user"})
        with self._lock:
            if self._pending >= MAX_PENDING:
                return self._answer(conn, {"ok": False, "reason": "busy: try again"})
            self._pending += 1
        threading.Thread(
            target=self._watch, args=(conn, pid, label), name=f"watch-{pid}", daemon=True
        ).start()
        return None

    def _watch(self, conn, pid, label):
        threads.background(f"watch-{pid}")
        try:
            run_id, reason = self._follow(pid, label)
        except Exception as exc:
            log.exception("bug: WATCH of pid %d failed", pid)
            run_id, reason = None, f"{type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._pending -= 1
        if run_id is None:
            return self._answer(conn, {"ok": False, "reason": reason})
        with self._lock:
            self._tracks.append((pid, run_id, time.monotonic_ns()))
        log.info("run %d: pid %d followed without a client (%s)", run_id, pid, label)
        return self._answer(conn, {"ok": True, "run_id": run_id})

    @staticmethod
    def _answer(conn, answer):
        payload = json.dumps(answer).encode()
        header = wire.HEADER.pack(
            wire.MAGIC, wire.VERSION, wire.DGRAM_WATCH, 0, 0, 0, time.monotonic_ns(), 0, 0
        )
        try:
            conn.sock.send(header + payload)
        except OSError:
            pass  # the requester is gone: nothing to tell
        return None

    # ----- the main loop's share -----------------------------------------------------
    def tick(self):
        """Hand new and ended processes to the other probes and coverage (main loop)."""
        with self._lock:
            tracks, self._tracks = self._tracks, []
            ends, self._ends = self._ends, []
        for pid, run_id, followed_ns in tracks:
            if run_id in self._gone:  # a process that exited within the last tick
                self._gone.discard(run_id)
                continue
            self.daemon.track_external(pid, run_id, followed_ns)
            self._live.add(run_id)
        for pid, run_id, ended_ns in ends:
            if run_id in self._live:
                self._live.discard(run_id)
                self.daemon.untrack_external(pid, run_id, ended_ns)
            elif pid not in self.daemon.extra_pids:
                self._gone.add(run_id)
