"""The /metrics endpoint: `--metrics-listen HOST:PORT` (config `metrics.listen`).

Starts prometheus-client's HTTP server on its own thread with a registry of
our own (the `Metrics` collector and nothing global), registers `Metrics` as
a store listener, and follows the live stall detector's alerts for the slow
step counts: the API's detector when the API runs, else one of its own fed
by the store like the API's. Plain HTTP, as Prometheus scrapes by default:
bind it to loopback or a private interface (docs/metrics.md). A port that
cannot be bound is a `ConfigError` before the daemon says it is ready. It
never touches the database but through `Metrics`' read-only cursors.
"""

import logging
import threading

from prometheus_client import CollectorRegistry, start_http_server

from stallscope.errors import ConfigError
from stallscope.service.config import parse_listen
from stallscope.service.metrics import Metrics

log = logging.getLogger("stallscope.metrics")


class _AlertFollower:
    """Counts stall alerts into `metrics` from a fanout subscription."""

    def __init__(self, metrics, fanout):
        from stallscope.api.fanout import Filter
        from stallscope.api.v1 import stallscope_pb2 as pb

        self.metrics = metrics
        self.fanout = fanout
        self.sub = fanout.subscribe(Filter(kinds=(pb.STALL_ALERT,)), name="metrics")
        self._thread = threading.Thread(target=self._run, name="metrics-alerts", daemon=True)
        self._thread.start()

    def _run(self):
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
        self._own_fanout = self._own_detector = None
        daemon.store.add_listener(self.metrics.on_batch)
        api = getattr(daemon, "api", None)
        if api is not None:
            fanout = api.fanout
        else:
            # No API: a detector of our own, fed exactly as the API feeds its.
            from stallscope.api.alerts import StallDetector
            from stallscope.api.fanout import Fanout

            def run_pids():
                return {r.run_id: r.pid for r in list(daemon.ingest.runs.values())}

            fanout = self._own_fanout = Fanout(run_pids)
            self._own_detector = StallDetector(fanout).start()
            daemon.store.add_listener(fanout.on_batch)
        self.alerts = _AlertFollower(self.metrics, fanout)
        shown = f"[{host}]" if ":" in host else host
        log.info("metrics serving on http://%s:%d/metrics", shown, self.port)

    def stop(self):
        self.daemon.store.remove_listener(self.metrics.on_batch)
        self.alerts.stop()
        if self._own_fanout is not None:
            self.daemon.store.remove_listener(self._own_fanout.on_batch)
            self._own_detector.stop()
            self._own_fanout.close_all()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=2)
