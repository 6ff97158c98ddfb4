"""The /metrics endpoint: `--metrics-listen HOST:PORT` (config `metrics.listen`).

Starts prometheus-client's HTTP server on its own thread with a registry of
our own (the `Metrics` collector and nothing global), registers `Metrics` as
a store listener, and follows the API's live stall detector's alerts for
the slow step counts (without the API there are none: a detector of its
own would cost ingest more than everything else here). Plain HTTP, as Prometheus scrapes by default:
bind it to loopback or a private interface (docs/metrics.md). A port that
cannot be bound is a `ConfigError` before the daemon says it is ready. It
never touches the database but through `Metrics`' read-only cursors.
"""

import logging
import threading

from prometheus_client import CollectorRegistry, start_http_server

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


class MetricsServer:
    """A running /metrics endpoint; `stop()` closes it and detaches from the store."""

    def __init__(self, daemon, listen, max_label_values):
        host, port = parse_listen(listen)
        self.daemon = daemon
        self.metrics = Metrics(daemon, max_label_values=max_label_values)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.metrics)
        try:
            self.httpd, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(
                f"metrics: cannot listen on {listen}: {exc.strerror or exc}"
            ) from None
        self.port = self.httpd.server_port
        # A scrape answers a waiting Prometheus (10 s timeout by default): its
        # server thread, and the request threads it starts, are serving
        # threads, not idle ones (threads.serving).
        reason = threads.serve_tid(self._thread.native_id, "metrics-http")
        if reason:
            log.info("metrics: %s", reason)
        daemon.store.add_listener(self.metrics.on_batch)
        api = getattr(daemon, "api", None)
        # Slow steps are the API's stall detector's alerts. Without the API no
        # detector of our own is started: its per-step work halved saturated
        # ingest (bench/metrics_cost.py), and metrics must not slow ingest.
        self.alerts = _AlertFollower(self.metrics, api.fanout) if api is not None else None
        if api is None:
            log.info(
                "metrics: stallscope_slow_steps_total stays empty without the API "
                "(api.socket): its live stall detector finds the slow steps"
            )
        shown = f"[{host}]" if ":" in host else host
        log.info("metrics serving on http://%s:%d/metrics", shown, self.port)

    def stop(self):
        self.daemon.store.remove_listener(self.metrics.on_batch)
        if self.alerts is not None:
            self.alerts.stop()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=2)
