"""The daemon process: wires ingest, probes, store and API together.

One thread runs the probe socket: it accepts, reads, and decodes what it
read every 0.7 s (each decode then flushed by the writer at once), as
records arrive (at most every 5 ms) while someone watches the live stream,
or as soon as `DECODE_BATCH_RECORDS` wait; it sleeps in the
selector while nothing arrives, waking every `IDLE_TICK_S` for housekeeping;
between two reads of slow clients it waits for a moment a traced thread
leaves its CPU idle (the gap clock, gaps.py).
The store's writer thread commits batches by size and age (store.py); each
kernel or GPU probe runs its own reader thread, which stretches its wait
while its ring is quiet. The daemon samples its own CPU time and RSS into
`daemon_stats` (selfstats.py). SIGTERM or SIGINT stops accepting, reads what
clients already sent, flushes and closes the database, and exits 0. A probe
that cannot run here is reported with its reason and the daemon runs on.
"""

import ctypes
import grp
import logging
import os
import signal
import threading
import time

from stallscope import gaps, threads
from stallscope import probes as probe_registry
from stallscope.errors import ConfigError
from stallscope.ingest.listener import LIGHT_ROUND_GAP_S, Ingest
from stallscope.ingest.requests import StacksRequests
from stallscope.ingest.sockets import prepare_path
from stallscope.probes import bpf_common
from stallscope.probes.base import ProbeSettings, Sink
from stallscope.service.deep import DeepWindows
from stallscope.service.export import DaemonExports
from stallscope.service.hang import HangWatchdog
from stallscope.service.placement import Placement
from stallscope.service.selfstats import SelfStats
from stallscope.service.systemd import endpoint
from stallscope.service.systemd import reload as config_reload
from stallscope.service.watch import PidWatcher
from stallscope.store.coverage import Coverage
from stallscope.store.database import DB_UMASK, DEFAULT_MAX_BACKLOG_ROWS, Store
from stallscope.store.retention import Retention
from stallscope.store.step_fill import StepFiller
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

# Without live subscribers nothing waits for a decode but the database: the
# writer flushes what each decode queued at once (Store.decoded), so a record
# waits at most this long plus one flush (a SIGKILL loses <= ~0.75 s with the
# client's 20 ms send), and a steady engine costs one decode and one flush
# per interval. Before, decodes 0.25 s apart and a flush 0.5 s after the
# first queued row cost 4 decodes and ~1.5 flushes a second for the same
# bound (each has a fixed cost: ~0.6 ms a decode at 200 steps/s, 3-5 ms a
# flush); a reader's cursor() still flushes first.
DECODE_INTERVAL_S = 0.7
# While someone watches the live stream, records are decoded as soon as
# they arrive (the selector wakes the loop; nothing is polled), at most once
# per LIVE_DECODE_INTERVAL_S so a flood of small datagrams is coalesced (each
# decode has a fixed cost: with probes sending every 2 ms, a 2 ms floor cost
# 63% of a core against 45% at 5 ms, for p50 3.9 vs 6.2 ms). A fixed 20 ms
# cadence used to do this: it added up to 20 ms to every event and woke 50
# times a second whether or not anything came (bench/results/api.md).
LIVE_DECODE_INTERVAL_S = 0.005
# Ingest stops reading sockets for a moment while the rows queued for the
# database pass this share of the store's backlog bound (daemon.max_backlog_rows)
# and the writer can be raised to normal priority to catch up: clients then
# see full sockets and count drops (reported as gaps), the probes' rows keep
# their room below the bound, and memory stays bounded.
INGEST_PAUSE_SHARE = 0.5
# Records read but not yet decoded beyond which decoding does not wait for
# the interval: the raw bytes were outside the bound above, and under a flood
# ~10 selector rounds (1.3 M records, ~500 MB once decoded and queued) used to
# pile up between two decodes.
DECODE_BATCH_RECORDS = 65_536
# With nothing arriving, the loop wakes this often (watchdog, deep windows,
# SIGHUP, self statistics) instead of every 50 ms.
IDLE_TICK_S = 0.5
# Light traffic gathers for the gap (LIGHT_ROUND_GAP_S, 0.2 s) before the
# next read: a client sends every 20 ms and its socket holds seconds of
# that, so waking 5 times a second instead of 20 halved the main loop's CPU
# at 200 steps/s (bench/daemon_footprint.py).
# ... but only while every connection is known to send slowly enough that
# the gap queues at most this many datagrams on it (a client socket holds
# ~46 of 4 KiB; ingest measures each connection's rate over 1 s windows). A
# new connection, or a client flushing 1,000 datagrams a second, is read
# round after round: a blind 200 ms gather overflowed such a client's
# socket (counted drops from a well-behaved client) and outlasted close()'s
# wait for the BYE. A round that read more than this is a burst (or several
# clients at once) and is followed by another read at once, not a gather.
# (It was 8, under what a 200 ms gather of a 200 steps/s client holds, 9-10
# datagrams: every gathered round then counted as heavy, and the loop woke
# again for the next single datagram, 12.9 wake-ups a second instead of ~5.)
LIGHT_ROUND_MAX_BACKLOG = 16
TICK_S = 0.1
# Threads that registered no role (DuckDB's, Arrow's, gRPC's) are moved to
# idle priority this often (stallscope.threads.sweep).
SWEEP_S = 1.0
# Kernel-cause probes (docs/kernel-causes.md), started after sched and gpu;
# `kernel_causes = none` leaves them off.
KERNEL_CAUSE_PROBES = ("page_faults", "irq", "steal", "syscalls")
# The CPU sampler (docs/cpu-sampler.md), last; `cpu_sampler = false` leaves it off.
CPU_PROBE = "cpu"
# The CUDA driver probe (docs/cuda-probe.md); `cuda_driver = false` leaves it off.
CUDA_PROBE = "cuda"


def limit_allocator_caches():
    """Keep freed memory from piling up in allocator caches (measured: peak RSS
    under a 5 s, 800k records/s burst fell from 450 MB to ~360 MB)."""
    try:
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())
    except Exception:
        pass
    try:
        ctypes.CDLL("libc.so.6").mallopt(-8, 2)  # M_ARENA_MAX = 2
    except (OSError, AttributeError):
        pass


# Libraries whose pages start-up touched and the daemon then rarely needs:
# the compiler bcc loads its programs with (LLVM, clang: ~200 MB of the
# daemon's resident set once the programs are compiled).
COMPILER_LIBRARIES = ("libLLVM", "libclang", "libbcc")
MADV_PAGEOUT = 21  # Linux 5.4+: reclaim these pages now (a clean file page is dropped)


def release_startup_memory(proc_maps="/proc/self/maps"):
    """Hand back what start-up left resident: the heap it freed (glibc keeps
    free chunks in its arenas: ~75 MB after clang compiled the bcc
    programs) and the compiler libraries' pages (file-backed and clean:
    reclaiming them is what the kernel does under memory pressure anyway; a
    later compile, e.g. a probe reloaded, reads them back). Returns the
    bytes of mappings advised; never raises."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    try:
        libc.malloc_trim(0)
    except AttributeError:
        pass
    advised = 0
    try:
        with open(proc_maps) as f:
            lines = f.readlines()
    except OSError:
        return 0
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6 or not any(n in parts[5] for n in COMPILER_LIBRARIES):
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if libc.madvise(lo, hi - lo, MADV_PAGEOUT) == 0:
            advised += hi - lo
    return advised


class StoreSink(Sink):
    """What probes write into: the store, with losses as rows."""

    def __init__(self, store):
        self.store = store

    def append(self, table, columns):
        self.store.append(table, columns)

    def loss(self, probe, start_ns, end_ns, count, reason):
        # As a row of the flush's one `losses` INSERT, not a statement of its
        # own (~0.5 ms each: the CPU sampler reports native-only samples of
        # torch's OpenMP workers once a second), riding with the next flush
        # rather than starting one.
        self.store.record_losses(
            probe, [(None, int(start_ns), int(end_ns), int(count), str(reason))], ride=True
        )

    def status(self, probe, backend, state, detail):
        self.store.record_probe_status(probe, backend, state, detail)


def light_round(read, ingest):
    """Whether the main loop may gather for LIGHT_ROUND_GAP_S after a round
    that read `read` datagrams: it read some, no more than a gather of
    slow clients queues, and every connection is known to send slowly."""
    return 0 < read <= LIGHT_ROUND_MAX_BACKLOG and ingest.slow_enough(
        LIGHT_ROUND_GAP_S, LIGHT_ROUND_MAX_BACKLOG
    )


class Daemon:
    def __init__(
        self,
        socket_path,
        db_path,
        api_socket=None,
        listen_fd=None,
        pids=(),
        sched_backend=None,
        gpu_backend=None,
        settings=None,
        allowed_uids=None,
        flush_interval_s=0.5,
        notify=None,
        api_options=None,
        config_source=None,
        config=None,
        retention_limits=None,
        stop_event=None,
        step_fill_interval_s=60.0,
        step_fill_cpu_share=0.001,
        metrics_listen=None,
        metrics_max_label_values=32,
        max_backlog_rows=DEFAULT_MAX_BACKLOG_ROWS,
        duckdb_threads=1,
        keep_off_engine_cpus=True,
    ):
        self.settings = settings or ProbeSettings()
        limit_allocator_caches()
        # Files the daemon creates (database, WAL, exports) are never
        # world-readable; sockets set their own mode explicitly.
        os.umask(os.umask(DB_UMASK) | DB_UMASK)
        if (config or {}).get("export.after_retention") and not config.get("export.parquet_dir"):
            raise ConfigError("export.after_retention needs export.parquet_dir (--export-dir DIR)")
        # The main thread keeps pace with the clients (the probe socket); all
        # work that can wait runs on background threads (stallscope.threads).
        threads.paced("main")
        self.store = Store(
            db_path,
            flush_interval_s=flush_interval_s,
            max_backlog_rows=max_backlog_rows,
            duckdb_threads=duckdb_threads,
        )
        self.placement = Placement(enabled=keep_off_engine_cpus)
        threads.set_dodging(keep_off_engine_cpus)
        self.sink = StoreSink(self.store)
        self.coverage = Coverage(self.store)
        self.selfstats = SelfStats(self.store)
        self.step_fill = StepFiller(
            self.store, interval_s=step_fill_interval_s, cpu_share=step_fill_cpu_share
        )
        self.probes = []
        self.extra_pids = set(pids)
        # The CLI passes stopping.STOP, set by SIGTERM from the first moment.
        self._stop = stop_event if stop_event is not None else threading.Event()
        self.notify = notify
        self.api = None
        self.fanout = self.detector = None  # the store's live listeners, with the API
        self.api_socket = api_socket
        self.api_options = api_options or {}
        self.metrics_listen = metrics_listen
        self.metrics_max_label_values = metrics_max_label_values
        self.metrics = None  # service/metrics_http.MetricsServer while serving
        self.started_ns = time.monotonic_ns()
        self.config_source = config_source  # re-read on SIGHUP (daemon/reload.py)
        self.config = config
        self.tracked_pids = set()
        self.stack_requests = None  # made at the first STACKS request
        # Set by the signal handlers, which take no lock (see _signalled).
        self._stop_asked = False
        self._reload_asked = False
        # Probes first, the probe socket last: a client that can connect is
        # a client whose scheduling the probes already follow. (Under socket
        # activation the socket predates us; `coverage` says from when each
        # probe covered each run.)
        self._start_probes(sched_backend, gpu_backend)
        try:
            group = grp.getgrnam("stallscope").gr_gid
        except KeyError:
            group = None
        try:
            self.ingest = Ingest(
                self.store,
                socket_path=socket_path,
                listen_fd=listen_fd,
                allowed_uids=allowed_uids,
                on_track=self._track,
                on_untrack=self._untrack,
                on_run_end=self.coverage.run_ended,
                socket_group=group,
                on_watch=self.watcher.request,
                on_stacks=self._stacks_request,
                on_step_threads=self._step_threads,
                on_pylayout=self._pylayout,
                on_pythreads=self._pythreads,
                proc_root=self.settings.proc_root,
                run_defaults=self._run_defaults(),
                request_open_timeout_s=(config or {}).get("requests.open_timeout_s", 600.0),
            )
        except BaseException:
            # e.g. the socket is in use by another daemon: release the probes
            # and the database before saying why.
            self._stop_probes()
            self.store.close()
            raise
        # GC of the --pid processes through CPython's USDT markers: a run each.
        self.watcher.follow_at_start(self.extra_pids)
        cfg = config or {}
        self.exports = DaemonExports(
            self.store, cfg.get("export.parquet_dir") or None, cfg.get("export.host") or None
        )
        after = self.exports.after_retention if cfg.get("export.after_retention") else None
        self.hangs = None
        if cfg.get("hang.watchdog", True):
            self.hangs = HangWatchdog(
                self,
                threshold_ms=cfg.get("hang.threshold_ms", 0.0),
                min_threshold_ms=cfg.get("hang.min_threshold_ms", 5000.0),
                p99_factor=cfg.get("hang.p99_factor", 10.0),
                min_dump_interval_s=cfg.get("hang.min_dump_interval_s", 60.0),
            )
        self.retention = (
            Retention(
                self.store,
                retention_limits,
                on_runs_deleted=self.ingest.forget_runs,
                after_check=after,
            )
            if retention_limits is not None
            else None
        )

    # ----- probes ----------------------------------------------------------------
    def _start_probes(self, sched_backend, gpu_backend):
        causes = None if self.settings.kernel_causes else "none"
        wanted = [("sched", sched_backend), ("gpu", gpu_backend)]
        wanted += [(n, causes) for n in KERNEL_CAUSE_PROBES]
        wanted.append(("placement", None if self.settings.placement else "none"))
        wanted.append((CPU_PROBE, None if self.settings.cpu_sampler else "none"))
        wanted.append((CUDA_PROBE, None if self.settings.cuda_driver else "none"))
        for name, prefer in wanted:
            if prefer == "none":
                self.store.record_probe_status(
                    name, None, "unavailable", "disabled by configuration"
                )
                log.info("%s probe: disabled", name)
                continue
            cls, skipped = probe_registry.select_backend(name, self.settings, prefer)
            for spec, reason in skipped:
                log.info("%s probe: skipped %s: %s", name, spec.rsplit(":", 1)[-1], reason)
            if cls is None:
                reason = "; ".join(r for _, r in skipped) or "no backend"
                self.store.record_probe_status(name, None, "unavailable", reason)
                log.warning("%s probe unavailable: %s", name, reason)
                continue
            try:
                probe = cls(self.settings)
                probe.start(self.sink)
            except Exception as exc:
                self.store.record_probe_status(
                    name, cls.backend, "failed", f"{type(exc).__name__}: {exc}"
                )
                log.error("%s probe (%s) failed to start: %s", name, cls.backend, exc)
                continue
            self.probes.append(probe)
            if getattr(probe, "sample_hz", None):  # a sampler: its rows are this many a second
                self.coverage.sample_hz[name] = probe.sample_hz
            detail = [getattr(probe, "detail", lambda: "")()] + [r for _, r in skipped]
            self.store.record_probe_status(
                name, cls.backend, "active", "; ".join(d for d in detail if d)
            )
            log.info("%s probe: using %s", name, cls.backend)
        self.deep = DeepWindows(self.probes, self.coverage, deep=self.settings.deep)
        self.watcher = PidWatcher(self)
        for pid in self.extra_pids:
            self._track(pid)

    def _run_defaults(self):
        """runs columns that say how this daemon's probes measure a run."""
        methods = [getattr(p, "method", None) for p in self.probes if p.name == "page_faults"]
        return {"page_fault_method": methods[0] if methods else None}

    def _stop_probes(self):
        for probe in self.probes:
            try:
                probe.stop()
            except Exception as exc:
                log.warning("%s probe did not stop cleanly: %s", probe.name, exc)

    def _track(self, pid, run_id=None):
        if run_id is not None:
            self.coverage.run_started(run_id, pid, [])
        self._follow(pid, run_id)

    def _follow(self, pid, run_id, skip=None):
        """Every probe but `skip` follows `pid`; each one's coverage row of
        `run_id` opens as its own track() returns, not when the last one's
        does: the main loop can be starved between two probes' track() (a
        nice-0 engine on its only CPU held it 5.6 s there, and the sched
        probe's rows of the whole run read "not looked at")."""
        self.tracked_pids.add(pid)
        for probe in self.probes:
            if probe is skip:
                continue
            try:
                probe.track(pid)
            except Exception as exc:
                log.warning("%s probe could not follow pid %d: %s", probe.name, pid, exc)
                continue
            if run_id is not None and probe.covering():
                self.coverage.run_started(run_id, pid, [probe.name])

    def _step_threads(self, pid, tids):
        """Threads of `pid` that emit spans: probes that summarise other
        threads keep exact rows for these, and the store's flushes keep off
        their CPUs (threads.dodge_step_threads)."""
        threads.note_step_threads(pid, tids)
        for probe in self.probes:
            detail = getattr(probe, "detail_threads", None)
            if detail is None:
                continue
            try:
                detail(pid, tids)
            except Exception as exc:
                log.warning(
                    "%s probe could not keep pid %d's step threads: %s", probe.name, pid, exc
                )

    def _stacks_request(self, conn, data):
        """A STACKS datagram (`stallscope stacks`): the hang watchdog's capture."""
        if self.stack_requests is None:
            capture = self.hangs.stacks if self.hangs is not None else None
            self.stack_requests = StacksRequests(
                lambda: self.tracked_pids, capture, self.settings.proc_root
            )
        return self.stack_requests.request(conn, data)

    def _probe(self, name):
        return next((p for p in self.probes if p.name == name), None)

    def _pylayout(self, pid, run_id, info):
        """A client's interpreter layout (ingest/pystate.py): None when the
        CPU sampler took it (or there is none to take it), else why not."""
        if self.hangs is not None:
            self.hangs.accept_layout(pid, info)
        probe = self._probe(CPU_PROBE)
        if probe is None:
            return None
        try:
            return probe.accept_layout(pid, run_id, info)
        except Exception as exc:
            log.warning("cpu probe could not take pid %d's layout: %s", pid, exc)
            return f"{type(exc).__name__}: {exc}"

    def _pythreads(self, pid, run_id, threads, more):
        """A client's (tid, thread state) list, the peer's own threads only."""
        if self.hangs is not None:
            self.hangs.set_threads(pid, threads)
        probe = self._probe(CPU_PROBE)
        if probe is None:
            return
        try:
            probe.set_threads(pid, run_id, threads, more)
        except Exception as exc:
            log.warning("cpu probe could not take pid %d's threads: %s", pid, exc)

    def track_external(self, pid, run_id, followed_ns):
        """A process followed with no client (service/watch.py): the other
        probes follow it as they would a client's, the GC probe keeps it
        (covering it since `followed_ns`)."""
        self.coverage.run_started(run_id, pid, ["gc"], followed_ns)
        # The watcher's track() means "a client took over": skipped here.
        self._follow(pid, run_id, skip=self.watcher.probe)

    def untrack_external(self, pid, run_id, ended_ns):
        self.coverage.run_ended(run_id, ended_ns)
        self._untrack(pid)

    def start_diagnosis(self, duration_s):
        """Attach the expensive probes for `duration_s` (see service/deep.py)."""
        return self.deep.start(duration_s)

    def _untrack(self, pid):
        if pid in self.extra_pids:
            return
        self.tracked_pids.discard(pid)
        threads.forget_step_threads(pid)
        if getattr(self, "hangs", None) is not None:
            self.hangs.forget(pid)
        for probe in self.probes:
            try:
                probe.untrack(pid)
            except Exception as exc:
                log.warning("%s probe could not stop following pid %d: %s", probe.name, pid, exc)

    def active_probes(self):
        return [f"{p.name}={p.backend}" for p in self.probes]

    # ----- API ---------------------------------------------------------------------
    def _start_api(self):
        """The store's live listeners (fan-out to subscribers, the stall
        detector subscribed to it), then the gRPC transport over them."""
        import socket

        from stallscope.api.server import start_api_server
        from stallscope.errors import ApiConfigError
        from stallscope.store.alerts import StallDetector
        from stallscope.store.fanout import Fanout
        from stallscope.store.request_ends import RequestFinishedFeed

        if self.api_socket and not prepare_path(self.api_socket, socket.SOCK_STREAM):
            raise ApiConfigError(f"another process serves the API on {self.api_socket}")

        def run_pids():
            return {r.run_id: r.pid for r in list(self.ingest.runs.values())}

        self.fanout = Fanout(run_pids)
        self.detector = StallDetector(self.fanout).start()
        try:
            self.api = start_api_server(self, self.api_socket, self.fanout, **self.api_options)
        except BaseException:
            self._stop_live()
            self.fanout.close_all()
            raise
        self.store.add_listener(self.fanout.on_batch)
        # RequestFinished events: each traced request's end, with its latency
        self.request_feed = RequestFinishedFeed(self.fanout, self.request_folder())
        if self.hangs is not None:  # Hung events: the watchdog's episodes, live
            self.hangs.listeners.append(self.hangs.to_fanout(self.fanout))

    def request_folder(self):
        """The one RequestFolder of this daemon (a store listener from the
        first call): the API's RequestFinished feed and the /metrics request
        histograms read its folds, so each batch is folded once."""
        folder = getattr(self, "_request_folder", None)
        if folder is None:
            from stallscope.store.request_ends import RequestFolder

            folder = self._request_folder = RequestFolder()
            self.store.add_listener(folder.on_batch)
        return folder

    def _stop_live(self):
        """Nothing more reaches the subscribers (the API's stop then closes
        their queues, after marking its streams as ending UNAVAILABLE)."""
        self.store.remove_listener(self.fanout.on_batch)
        feed = getattr(self, "request_feed", None)
        if feed is not None:
            feed.close()
        self.detector.stop()

    # ----- main loop -------------------------------------------------------------
    def stop(self, *_):
        """Ask the daemon to stop, from any thread but inside a signal handler."""
        self._stop.set()
        ingest = getattr(self, "ingest", None)
        if ingest is not None:
            ingest.wake()  # the main loop may be in a 0.5 s poll

    def _signalled(self, signum, _frame):
        """SIGTERM, SIGINT and SIGHUP once the daemon runs. A handler runs in
        the main thread between two of its bytecodes, so it takes no lock:
        Event.set() there waits for the Event's own lock, which the main
        loop holds while inside that Event's wait(), and the daemon hung
        (a SIGTERM during a light round's gather: 60 s, then SIGKILL). It
        sets a flag and wakes the main loop, which acts on it."""
        if signum == signal.SIGHUP:
            self._reload_asked = True
        else:
            self._stop_asked = True
        self.ingest.wake()

    def _stopping(self):
        """Whether to stop; a signal's request becomes the stop event here,
        outside the handler."""
        if self._stop_asked and not self._stop.is_set():
            self._stop.set()
        return self._stop.is_set()

    def run(self):
        self.store.start()
        self.step_fill.start()
        if self.hangs is not None:
            self.hangs.start()
        if self.retention is not None:
            self.retention.start()
        if self.api_socket or self.api_options.get("listen"):
            try:
                self._start_api()
            except BaseException:
                # e.g. another daemon serves that socket: close what is open
                # (probe socket, probes, database) before saying why.
                self.shutdown()
                raise
            if self.api_socket:
                endpoint.publish(self.store.path, self.api_socket)
        if self.metrics_listen:
            # After the API: the metrics count the API's stall alerts when it runs.
            from stallscope.service.metrics_http import MetricsServer

            try:
                self.metrics = MetricsServer(
                    self, self.metrics_listen, self.metrics_max_label_values
                )
            except BaseException:
                self.shutdown()
                raise
        signal.signal(signal.SIGTERM, self._signalled)
        signal.signal(signal.SIGINT, self._signalled)
        signal.signal(signal.SIGHUP, self._signalled)
        if self._stopping():
            log.info("stop requested during start-up: reading what clients sent, then exiting")
        log.info(
            "listening on %s, database %s, probes: %s",
            self.ingest.socket_path or "inherited socket",
            self.store.path,
            ", ".join(self.active_probes()) or "none",
        )
        release_startup_memory()
        self.selfstats.sample()  # names the threads started so far; first row
        if self.notify:
            self.notify.ready(self)
        # From here the main loop waits at idle priority while every client
        # is known to send slowly, and runs as a batch thread while there is
        # no client, or the moment one is new or fast or its socket holds a
        # backlog (threads.paced; listener.pace_backlog).
        threads.paced("main", backlog=self._main_backlog)
        threads.check_paced()  # no client yet: batch now, not at the first tick
        last_decode = last_tick = time.monotonic()
        last_sweep = 0.0
        known_conns = set()  # the ingest connections' fds after the last round
        while not self._stopping():
            if self.store.backlog() > INGEST_PAUSE_SHARE and not threads.boost_refused():
                # Push back on the clients while the writer, raised to normal
                # priority, catches up. A writer that cannot be raised may not
                # catch up before clients exit with full sockets (their tails
                # would go unreported): then ingest reads on and the store's
                # bound drops what does not fit, counted per run.
                threads.check_backlogs()
                self.ingest.sleep(0.01)
                continue
            live = self.api is not None and self.api.live_subscribers() > 0
            if live != bpf_common.LIVE.is_set():
                bpf_common.LIVE.set() if live else bpf_common.LIVE.clear()
            interval = LIVE_DECODE_INTERVAL_S if live else DECODE_INTERVAL_S
            now = time.monotonic()
            if self.ingest.has_pending():
                due = min(last_decode + interval, last_tick + TICK_S)
            else:
                due = last_tick + IDLE_TICK_S
            read = self.ingest.poll(min(IDLE_TICK_S, max(0.0, due - now)))
            conns = self.ingest.conns.keys()
            if read or conns - known_conns:
                # A new connection keeps the loop raised until its rate is
                # known (threads.paced), so the HELLO and the probes' track()
                # it starts run at batch priority: at idle priority, beside a
                # CPU hog on each CPU, that took 5-10 s and a 10 s run went
                # unsampled.
                threads.check_paced()
            known_conns = set(conns)
            if not live and light_round(read, self.ingest):
                # Light traffic (a client sends every 20 ms): let a few
                # datagrams gather instead of waking for each; heavy traffic
                # is read round after round (the queue holds 128 datagrams).
                # Never past the decode's due time, which bounds a SIGKILL's loss.
                # The read after the gather waits for a moment a traced
                # thread leaves its CPU idle (gaps.py), at most until twice
                # the gap (a slow client's socket holds ~46 datagrams, the
                # gap's rate check allows 16 a gap) or the decode's due time.
                due = last_decode + interval - time.monotonic()
                gap = min(LIGHT_ROUND_GAP_S, due)
                if gap > 0:
                    hard = min(2 * LIGHT_ROUND_GAP_S, due)
                    gaps.wait(gap, hard, self.ingest.wake, self.ingest.sleep)
            now = time.monotonic()
            if self.ingest.undecoded >= DECODE_BATCH_RECORDS or (
                now >= last_decode + interval and self.ingest.has_pending()
            ):
                self.ingest.decode_pending()
                last_decode = now
                if not live:
                    # Live, decodes are ms apart: the writer keeps its 0.5 s age rule.
                    self.store.decoded()
            if now >= last_tick + TICK_S:
                last_tick = now
                self.deep.tick()
                self.watcher.tick()
                threads.check_backlogs()
                if now >= last_sweep + SWEEP_S:
                    last_sweep = now
                    threads.sweep()
                self.placement.tick(self.tracked_pids)
                self.selfstats.tick(self.tracked_pids)
                if self._reload_asked:
                    self._reload_asked = False
                    config_reload.apply(self)
                if self.notify:
                    self.notify.tick(self)
        self.shutdown()
        return 0

    def _main_backlog(self):
        """The main loop's gauge (threads.paced): full while no client is
        connected, so that the next one is accepted and its HELLO read at
        once (at idle priority, beside a nice-0 thread spinning on its CPU,
        the main loop got ~0.3 % of that CPU and read a HELLO seconds late,
        after most of the run); else the clients' (listener.pace_backlog)."""
        if not self.ingest.conns:
            return 1.0
        return self.ingest.pace_backlog()

    def shutdown(self):
        # Stopping is bounded in time (systemd's stop timeout, clients'
        # tails): every thread leaves idle priority for it.
        threads.boost_all()
        if self.notify:
            self.notify.stopping()
        t0 = time.monotonic()
        if self.metrics is not None:
            self.metrics.stop()
        if self.api is not None:
            self._stop_live()
            self.api.stop(grace=0.5)
            endpoint.withdraw(self.store.path)
        self.ingest.close()
        if self.hangs is not None:
            self.hangs.stop()
        if self.retention is not None:
            self.retention.stop()
        self._stop_probes()
        self.coverage.close_all()
        self.step_fill.stop()
        self.store.close()
        log.info(
            "stopped in %.0f ms; %d records received, %d known lost, %d rejected",
            (time.monotonic() - t0) * 1000,
            self.ingest.records_received,
            self.ingest.lost_records,
            sum(self.ingest.rejections.values()),
        )
