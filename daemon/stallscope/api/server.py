"""The daemon's gRPC server: StreamEvents, Query, GetStatus, ListRuns.

`start_api_server(daemon, api_socket, fanout, listen=None, tls_cert=None,
tls_key=None, client_ca=None)` serves the Stallscope service plus standard
health checking and reflection (v1 and v1alpha) on a Unix socket (mode 0660, group
stallscope when it exists) and, only with a certificate and key, on TCP with
TLS (mutual TLS when a client CA is given). Transport only: live events come
from the store's `fanout` (bounded per-subscriber queues; stall alerts are
one more kind in it), which the service creates and subscribes to the store;
SQL runs in `analysis.sandbox` and is cut into messages by size in
`query_stream`; diagnosis windows and exports are the daemon's
(`daemon.start_diagnosis`, `daemon.exports`), turned into status codes here.
It never writes to the database and never blocks a producer. Plain-text TCP
is refused, never silently served.
"""

import grp
import logging
import os
import socket
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from stallscope import threads
from stallscope.analysis.sandbox import QueryRun
from stallscope.api import events, query_stream, reflection
from stallscope.api.status_parts import clock_pair, package_version, set_stats
from stallscope.api.v1 import stallscope_pb2 as pb
from stallscope.api.v1 import stallscope_pb2_grpc as pb_grpc
from stallscope.api.values import from_value
from stallscope.errors import ApiConfigError, ExportBusy, NotSandboxed, QueryError, StallscopeError
from stallscope.store.fanout import DropMark, Filter
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Stallscope"].full_name
MAX_SUBSCRIBERS = 16
MAX_CONCURRENT_QUERIES = 2
# A stream sends what it has at least this often (s); an idle stream wakes
# this often to notice a cancelled client.
STREAM_WAKE_S = 0.25
MAX_EVENTS_PER_MESSAGE = 4096
MAX_RUNS_PAGE = 1000
# Subscribers inside the daemon (the stall detector; /metrics counting its
# alerts): not event streams, so not counted as watchers, limited or reported.
INTERNAL_SUBSCRIBERS = frozenset({"stall-detector", "metrics"})


def _streams(fanout):
    """The fanout's StreamEvents subscribers (internal ones left out)."""
    return [s for s in fanout.subscribers if s.name not in INTERNAL_SUBSCRIBERS]


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _dropped_event(mark):
    return pb.Event(
        dropped=pb.Dropped(
            count=mark.count,
            total=mark.total,
            reason="subscriber_queue_full",
            from_ns=mark.from_ns or 0,
            to_ns=mark.to_ns or 0,
            kinds=sorted(mark.kinds),
        )
    )


class StallscopeServicer(pb_grpc.StallscopeServicer):
    """The rpcs; method names are the rpc names."""

    def __init__(self, daemon, fanout):
        self.daemon = daemon
        self.fanout = fanout
        self._queries = threading.BoundedSemaphore(MAX_CONCURRENT_QUERIES)
        self.started_ns = getattr(daemon, "started_ns", time.monotonic_ns())
        self.shutting_down = False  # set by ApiServer.stop: streams end UNAVAILABLE
        self.missing_columns = {}  # "KIND.column" -> batches streamed without it
        # What reads the database runs off the handler threads: a user's
        # query and a status as serving threads (batch, nice 0: a fair share
        # on a saturated host, like the user's own command, and never a
        # wake-up preemption), an export, which can take CPU-seconds, at idle
        # priority (threads.serving, threads.background).
        self.background = threads.BackgroundPool(
            "api-query", MAX_CONCURRENT_QUERIES + 2, role=threads.SERVING
        )
        self.exporting = threads.BackgroundPool("api-export", 1)

    def _missing_columns(self, kind, columns):
        """A batch lacked columns its kind must have: the stream goes on with
        unknown values; counted in GetStatus, logged once per column."""
        for column in columns:
            key = f"{pb.EventKind.Name(kind)}.{column}"
            if key not in self.missing_columns:
                log.error(
                    "streamed %s events without their %r column (sent as unknown): the "
                    "producer and the schema disagree; counted in status",
                    pb.EventKind.Name(kind),
                    column,
                )
            self.missing_columns[key] = self.missing_columns.get(key, 0) + 1

    # ----- StreamEvents -------------------------------------------------------------
    def StreamEvents(self, request, context):
        if len(_streams(self.fanout)) >= MAX_SUBSCRIBERS:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {MAX_SUBSCRIBERS} event streams at once",
            )
        flt = Filter(
            kinds=request.kinds,
            span_kinds=request.span_kinds,
            run_ids=request.run_ids,
            pids=request.pids,
            min_duration_ns=request.min_duration_ns,
        )
        sub = self.fanout.subscribe(flt, request.max_queue_events, name=context.peer())
        context.add_callback(sub.close)
        log.info("event stream opened by %s", context.peer())
        try:
            while not sub.closed and context.is_active():
                # Woken by the producer as soon as a batch is queued (no
                # polling cadence of its own); the timeout only notices a
                # cancelled client.
                items = sub.take_ordered(STREAM_WAKE_S)
                if not items:
                    continue
                out = []
                runs = self.fanout.runs_for(items)
                for item in items:
                    if isinstance(item, DropMark):
                        # In its place: what came before it was delivered.
                        out.append(_dropped_event(item))
                        continue
                    kind, batch = item
                    chosen = flt.apply(kind, batch, runs)
                    if chosen.num_rows:
                        out.extend(
                            events.to_events(kind, chosen, runs, on_missing=self._missing_columns)
                        )
                for i in range(0, len(out), MAX_EVENTS_PER_MESSAGE):
                    part = out[i : i + MAX_EVENTS_PER_MESSAGE]
                    for ev in part:
                        ev.seq = sub.seq
                        sub.seq += 1
                    yield pb.EventBatch(events=part, sent_ns=time.monotonic_ns())
            if self.shutting_down and context.is_active():
                # Not OK: a client must be able to tell "the daemon went away"
                # from "the stream is complete", and retry elsewhere or later.
                context.abort(grpc.StatusCode.UNAVAILABLE, "the daemon is shutting down")
        finally:
            self.fanout.unsubscribe(sub)
            log.info(
                "event stream closed by %s (%d events sent, %d dropped)",
                context.peer(),
                sub.seq,
                sub.dropped_total,
            )

    # ----- Query ------------------------------------------------------------------------
    def Query(self, request, context):
        if not self._queries.acquire(timeout=5):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{MAX_CONCURRENT_QUERIES} queries already running; try again",
            )
        try:
            try:
                run = self.background.call(
                    QueryRun(
                        self.daemon.store,
                        request.sql,
                        [from_value(v) for v in request.params],
                        max_rows=request.max_rows,
                        timeout_s=request.timeout_ms / 1000.0,
                        batch_rows=request.batch_rows,
                    ).start
                )
            except QueryError as exc:
                context.abort(query_stream.status_code(exc), str(exc))
            except NotSandboxed as exc:
                log.error("%s", exc)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            # Timer and cursor must go when the client cancels mid-stream.
            context.add_callback(run.close)
            columns = [pb.Column(name=n, type=t) for n, t in run.columns]
            try:
                yield from self.background.iterate(
                    lambda: query_stream.messages(
                        run,
                        request.format == pb.ARROW_IPC,
                        query_stream.message_limit(request.max_message_bytes),
                        columns,
                    )
                )
            except QueryError as exc:
                run.close()
                context.abort(query_stream.status_code(exc), str(exc))
        finally:
            self._queries.release()

    # ----- GetStatus / ListRuns -----------------------------------------------------
    def _sql(self, sql, params=None):
        return self.background.call(self._sql_here, sql, params)

    def _sql_here(self, sql, params=None):
        cur = self.daemon.store.cursor()
        try:
            return cur.execute(sql, params or []).fetchall()
        finally:
            cur.close()

    def _runs(self, live_only=False, before_run_id=None, limit=None):
        where = []
        params = []
        if live_only:
            where.append("ended_ns IS NULL")
        if before_run_id is not None:
            where.append("run_id < ?")
            params.append(before_run_id)
        rows = self._sql(
            "SELECT run_id, pid, label, python, started_ns, connected_ns, ended_ns, "
            "records, connections, host, realtime_ns FROM runs "
            + ("WHERE " + " AND ".join(where) + " " if where else "")
            + "ORDER BY run_id DESC"
            + (f" LIMIT {int(limit)}" if limit else ""),
            params,
        )
        return [
            pb.RunSummary(
                run_id=r[0],
                pid=r[1] or 0,
                label=r[2] or "",
                python=r[3] or "",
                started_ns=r[4] or 0,
                connected_ns=r[5] or 0,
                ended_ns=r[6] or 0,
                live=r[6] is None,
                records=r[7] or 0,
                connections=r[8] or 0,
                host=r[9] or "",
                realtime_start_ns=r[10] or 0,
            )
            for r in rows
        ]

    def GetStatus(self, request, context):
        d = self.daemon
        store = d.store
        realtime_ns, monotonic_ns = clock_pair()
        st = pb.Status(
            version=package_version(),
            daemon_pid=os.getpid(),
            uptime_ns=time.monotonic_ns() - self.started_ns,
            db_path=store.path,
            realtime_offset_ns=realtime_ns - monotonic_ns,
            monotonic_ns=monotonic_ns,
            host=getattr(d.ingest, "host", "") or socket.gethostname(),
        )
        st.db_bytes = sum(
            os.path.getsize(p) for p in (store.path, store.path + ".wal") if os.path.exists(p)
        )
        active = {p.name: p for p in getattr(d, "probes", [])}
        try:
            rows = self._sql(
                "SELECT probe, backend, state, detail FROM probe_status QUALIFY row_number() "
                "OVER (PARTITION BY probe ORDER BY ts_ns DESC) = 1 ORDER BY probe"
            )
        except Exception:
            rows = []
        seen = set()
        for probe, backend, state, detail in rows:
            seen.add(probe)
            ps = pb.ProbeState(
                probe=probe, backend=backend or "", state=state or "", detail=detail or ""
            )
            if probe in active:
                set_stats(ps, active[probe])
            st.probes.append(ps)
        for name, probe in active.items():  # not yet flushed to probe_status
            if name not in seen:
                ps = pb.ProbeState(probe=name, backend=probe.backend, state="active")
                set_stats(ps, probe)
                st.probes.append(ps)
        try:
            st.connected_runs.extend(self._runs(live_only=True))
        except Exception as exc:
            log.debug("runs unavailable: %s", exc)
        ing = d.ingest.status()
        st.records_received = ing.get("records_received", 0)
        st.client_records_lost = ing.get("lost_records", 0)
        st.rejections.update({k: int(v) for k, v in ing.get("rejections", {}).items()})
        st.rows_written = store.rows_written
        st.rows_lost = store.rows_lost
        st.pending_rows = store.pending_rows
        st.stream_missing_columns.update(self.missing_columns)
        st.subscribers = len(_streams(self.fanout))
        internal = [s for s in self.fanout.subscribers if s.name in INTERNAL_SUBSCRIBERS]
        st.stream_events_dropped = self.fanout.dropped_total() - sum(
            s.dropped_total for s in internal
        )
        try:
            st.losses_recorded = self._sql("SELECT coalesce(sum(count), 0) FROM losses")[0][0]
        except Exception:
            pass
        return st

    def ListRuns(self, request, context):
        before = None
        if request.page_token:
            try:
                before = int(request.page_token)
            except ValueError:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"page_token {request.page_token!r} is not one this server gave: "
                    "pass next_page_token of the previous answer, or '' for the first page",
                )
        if request.page_size < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "page_size must be >= 0")
        size = min(request.page_size, MAX_RUNS_PAGE) if request.page_size else None
        # One more than asked says whether another page exists.
        runs = self._runs(request.live_only, before, size + 1 if size else None)
        resp = pb.ListRunsResponse(runs=runs[:size] if size else runs)
        if size and len(runs) > size:
            resp.next_page_token = str(runs[size - 1].run_id)
        return resp

    def StartDiagnosis(self, request, context):
        daemon = self.daemon
        try:
            until_ns, names = daemon.start_diagnosis(request.duration_ms / 1000.0)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except RuntimeError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.StartDiagnosisResponse(
            until_ns=until_ns or 0, probes=names, deep=daemon.deep.deep
        )

    def ExportParquet(self, request, context):
        exports = self.daemon.exports
        if exports.out_dir is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "the daemon has no export directory: start it with --export-dir DIR "
                "(config export.parquet_dir)",
            )
        if request.dir and os.path.abspath(request.dir) != exports.out_dir:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the daemon exports to {exports.out_dir} only (its --export-dir), not {request.dir}",
            )
        try:
            result = self.exporting.call(exports.export)
        except ExportBusy as exc:
            context.abort(grpc.StatusCode.ABORTED, str(exc))
        except (StallscopeError, OSError) as exc:
            context.abort(grpc.StatusCode.INTERNAL, f"export failed: {exc}")
        return pb.ExportParquetResponse(
            dir=result.out_dir,
            host=result.host,
            watermark_ns=result.watermark_ns,
            tables=[pb.ExportedTable(table=t, rows=n) for t, n in sorted(result.rows.items())],
            files=result.files,
            runs_derived=result.runs_derived,
        )


class ApiServer:
    """The running server; `stop(grace)` ends streams and closes sockets."""

    def __init__(self, server, fanout, api_socket, tcp_port, health=None, servicer=None):
        self.server = server
        self.health = health
        self.servicer = servicer
        self.fanout = fanout
        self.api_socket = api_socket
        self.tcp_port = tcp_port

    def live_subscribers(self):
        """Open StreamEvents streams (the stall detector not counted): the daemon
        may decode more often while someone watches (bench/results/api.md)."""
        return len(_streams(self.fanout))

    def stop(self, grace=0.5):
        """NOT_SERVING first (Health.Watch clients hear it), then streams end
        with UNAVAILABLE, then the server stops after `grace` seconds."""
        if self.health is not None:
            self.health.enter_graceful_shutdown()  # every service -> NOT_SERVING
        if self.servicer is not None:
            self.servicer.shutting_down = True
        self.fanout.close_all()
        self.server.stop(grace).wait(grace + 2)
        if self.servicer is not None:
            self.servicer.background.shutdown()
            self.servicer.exporting.shutdown()
        if self.api_socket:
            try:
                os.unlink(self.api_socket)
            except OSError:
                pass


def start_api_server(
    daemon, api_socket, fanout, listen=None, tls_cert=None, tls_key=None, client_ca=None
):
    """Serve the API for `daemon`, live events from `fanout`; returns an
    ApiServer. The caller has prepared the socket's path (the service:
    directory made, a stale file removed) and checked the TLS options with
    the rest of the configuration (config.check_api); raises ApiConfigError
    when there is no endpoint or it cannot be served."""
    if not api_socket and not listen:
        raise ApiConfigError(
            "no API endpoint: give --api-socket PATH and/or --grpc-listen HOST:PORT with TLS"
        )
    servicer = StallscopeServicer(daemon, fanout)
    server = grpc.server(
        # Handler threads answer a waiting client: serving threads (batch,
        # nice 0), like the gRPC poller started below. At idle priority a
        # Query waited seconds on a host whose CPUs a hog filled.
        futures.ThreadPoolExecutor(
            max_workers=MAX_SUBSCRIBERS + MAX_CONCURRENT_QUERIES + 4,
            thread_name_prefix="api",
            initializer=threads.serving,
            initargs=("api-handler",),
        ),
        maximum_concurrent_rpcs=MAX_SUBSCRIBERS + MAX_CONCURRENT_QUERIES + 8,
        options=[("grpc.max_send_message_length", 64 << 20), ("grpc.so_reuseport", 0)],
    )
    pb_grpc.add_StallscopeServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME), server)

    tcp_port = None
    old = os.umask(0o117)  # the socket file is born 0660, never wider
    try:
        if api_socket:
            server.add_insecure_port("unix:" + os.path.abspath(api_socket))
        if listen:
            creds = grpc.ssl_server_credentials(
                [(_read(tls_key), _read(tls_cert))],
                root_certificates=_read(client_ca) if client_ca else None,
                require_client_auth=bool(client_ca),
            )
            tcp_port = server.add_secure_port(listen, creds)
            if not tcp_port:
                raise RuntimeError(f"could not listen on {listen}")
        before = set(threading.enumerate())
        server.start()
        for started in set(threading.enumerate()) - before:  # gRPC's poller
            started.name = "api-grpc"  # its comm: stallscope/api-
            threads.serve_tid(started.native_id, "api-grpc")
    except (RuntimeError, OSError) as exc:
        raise ApiConfigError(f"API: {exc}") from None
    finally:
        os.umask(old)
    if api_socket:
        os.chmod(api_socket, 0o660)
        try:
            os.chown(api_socket, -1, grp.getgrnam("stallscope").gr_gid)
        except (KeyError, OSError):
            pass
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    where = []
    if api_socket:
        where.append(f"unix:{api_socket}")
    if listen:
        host = listen.rsplit(":", 1)[0]
        where.append(
            f"tcp {host}:{tcp_port} (TLS{', client certificates required' if client_ca else ''})"
        )
    log.info("API serving on %s", " and ".join(where))
    return ApiServer(
        server, fanout, api_socket, tcp_port, health=health_servicer, servicer=servicer
    )
