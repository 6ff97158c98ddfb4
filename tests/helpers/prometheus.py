"""A real Prometheus server for a test (Debian's `prometheus` package), and
helpers to read a daemon's /metrics.

`PrometheusServer(tmp_path, targets)` writes a temporary config that scrapes
`targets` ("host:port") every second, starts the server on a loopback port
with its storage under tmp_path, waits until it is ready, and answers PromQL
through its HTTP API (`query`). A missing binary is a skip, or a failure
under STALLSCOPE_REQUIRE_PRIVILEGED=1 (CI), like the privileged tests.
"""

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

from helpers.privileged import require_privileged
from helpers.waiting import wait_for

SCRAPE_INTERVAL = "1s"


def require_prometheus():
    """The prometheus binary's path (skip, or fail in CI, when there is none)."""
    path = shutil.which("prometheus")
    require_privileged(
        path is not None,
        "needs a Prometheus server: Debian's prometheus package (make bootstrap as root)",
    )
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics_port(daemon, timeout_s=15):
    """The port a daemon started with --metrics-listen HOST:0 serves on (its log)."""
    found = wait_for(
        lambda: re.search(r"metrics serving on http://\S+:(\d+)/metrics", daemon.new_log()),
        timeout_s,
    )
    assert found, daemon.new_log()
    return int(found.group(1))


def scrape(port, host="127.0.0.1"):
    """The /metrics text of a daemon."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def samples(text):
    """{(name, frozenset(labels.items())): value} of an exposition text."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(parsed, name, **labels):
    """Sum of the samples called `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in parsed.items() if n == name and want <= ls)


class PrometheusServer:
    def __init__(self, tmp_path, targets):
        self.binary = require_prometheus()
        self.dir = tmp_path / "prometheus"
        self.dir.mkdir()
        self.config = self.dir / "prometheus.yml"
        listed = ", ".join(f"'{t}'" for t in targets)
        self.config.write_text(
            "global:\n"
            f"  scrape_interval: {SCRAPE_INTERVAL}\n"
            f"  scrape_timeout: {SCRAPE_INTERVAL}\n"
            "scrape_configs:\n"
            "  - job_name: stallscope\n"
            f"    static_configs:\n      - targets: [{listed}]\n"
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.dir / "prometheus.log"
        self.proc = None

    def start(self, timeout_s=60):
        self._logf = open(self.log, "w")
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._logf,
            stderr=self._logf,
        )
        ready = wait_for(self._ready, timeout_s, interval_s=0.2)
        assert ready, f"prometheus did not become ready:\n{self.log.read_text()}"
        return self

    def _ready(self):
        assert self.proc.poll() is None, f"prometheus exited:\n{self.log.read_text()}"
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def api(self, path, **params):
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql):
        """An instant vector as {frozenset(labels.items()): float}."""
        data = self.api("query", query=promql, time=f"{time.time():.3f}")
        assert data["resultType"] == "vector", data
        return {frozenset(r["metric"].items()): float(r["value"][1]) for r in data["result"]}

    def scalar(self, promql):
        """The single value of a query (None while it has no result)."""
        got = self.query(promql)
        return next(iter(got.values())) if got else None

    def target_health(self):
        return [t["health"] for t in self.api("targets")["activeTargets"]]

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._logf.close()
