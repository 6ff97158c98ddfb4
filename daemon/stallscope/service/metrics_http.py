"""The /metrics endpoint: `--metrics-listen HOST:PORT` (config `metrics.listen`).

Starts prometheus-client's HTTP server on its own thread (a serving thread,
as is each request's: a scrape is served while engines fill the CPUs,
docs/footprint.md) with a registry of our own (the `Metrics`
collector and nothing global), registers `Metrics` as
a store listener, and follows the API's live stall detector's alerts for
the slow step counts (without the API there are none: a detector of its
own would cost ingest more than everything else here). Plain HTTP, as Prometheus scrapes by default:
bind it to loopback or a private interface (docs/metrics.md). A port that
cannot be bound is a `ConfigError` before the daemon says it is ready. It
never touches the database but through `Metrics`' read-only cursors.
"""

import logging
import socket
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from stallscope import threads
from stallscope.errors import ConfigError
from stallscope.service.config import parse_listen
from stallscope.service.metrics import Metrics
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))


class _AlertFollower:
    """Counts stall alerts into `metrics` from a fanout subscription."""

    def __init__(self, metrics, fanout):
        from stallscope.store.fanout import Filter
        from stallscope.vocab.event_kinds import STALL_ALERT

        self.metrics = metrics
        self.fanout = fanout
        self.sub = fanout.subscribe(Filter(kinds=(STALL_ALERT,)), name="metrics")
        self._thread = threading.Thread(target=self._run, name="metrics-alerts", daemon=True)
        self._thread.start()

    def _run(self):
        threads.background("metrics-alerts")
        while not self.sub.closed:
            items, _ = self.sub.take(0.5)
            for _, batch in items:
                try:
                    self.metrics.fold_alerts(batch)
                except Exception:
                    log.exception("metrics: could not count stall alerts; continuing")

    def stop(self):
        self.fanout.unsubscribe(self.sub)
        self._thread.join(timeout=2)


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args):
        pass


class _Server(ThreadingWSGIServer):
    """prometheus-client's thread-per-request server whose threads are
    serving threads (stallscope.threads.serving): at idle priority, where
    the sweep would put an unknown thread, a scrape starved for over 10 s
    while a spinning engine and other work filled both CPUs."""

    def process_request_thread(self, request, client_address):
        threads.serving("metrics-request")
        try:
            super().process_request_thread(request, client_address)
        finally:
            threads.forget()


def _serve(httpd):
    threads.serving("metrics-http")
    httpd.serve_forever()


def start_server(host, port, registry):
    """(server, thread) serving `registry` at http://host:port/metrics."""
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = info[0]
    server_class = type("_MetricsServer", (_Server,), {"address_family": family})
    httpd = make_server(sockaddr[0], port, make_wsgi_app(registry), server_class, _Quiet)
    thread = threading.Thread(target=_serve, args=(httpd,), name="metrics-http", daemon=True)
    thread.start()
    return httpd, thread


class MetricsServer:
    """A running /metrics endpoint; `stop()` closes it and detaches from the store."""

    def __init__(self, daemon, listen, max_label_values):
        host, port = parse_listen(listen)
        self.daemon = daemon
        folder = daemon.request_folder() if hasattr(daemon, "request_folder") else None
        self.metrics = Metrics(daemon, max_label_values=max_label_values, folder=folder)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.metrics)
        try:
            self.httpd, self._thread = start_server(host, port, self.registry)
        except OSError as exc:
            raise ConfigError(
                f"metrics: cannot listen on {listen}: {exc.strerror or exc}"
            ) from None
        self.port = self.httpd.server_port
        daemon.store.add_listener(self.metrics.on_batch)
        api = getattr(daemon, "api", None)
        # Slow steps are the API's stall detector's alerts. Without the API no
        # detector of our own is started: its per-step work halved saturated
        # ingest (bench/metrics_cost.py), and metrics must not slow ingest.
        self.alerts = _AlertFollower(self.metrics, api.fanout) if api is not None else None
        if self.alerts is not None:
            self.metrics.follow_alerts()
        if api is None:
            log.info(
                "metrics: stallscope_slow_steps_total stays empty without the API "
                "(api.socket): its live stall detector finds the slow steps"
            )
        shown = f"[{host}]" if ":" in host else host
        log.info("metrics serving on http://%s:%d/metrics", shown, self.port)

    def stop(self):
        self.daemon.store.remove_listener(self.metrics.on_batch)
        self.metrics.close()
        if self.alerts is not None:
            self.alerts.stop()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=2)
