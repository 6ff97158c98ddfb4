"""A real Prometheus server scrapes a real daemon while a real engine runs, and
PromQL over its HTTP API returns the step and GC counts the database holds."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.daemonproc import DaemonProcess
from helpers.prometheus import (
    PrometheusServer,
    metrics_port,
    require_prometheus,
    samples,
    scrape,
    total,
)
from helpers.waiting import wait_for

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

ENGINE = Path(__file__).with_name("metrics_engine.py")
DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
# Panels that must show data after the engine's run (no GPU, no kernel probes here).
MUST_HAVE_DATA = ("Step time", "Steps per second", "GC passes", "GC pause", "Records", "Daemon")
LABEL = "prom-e2e"


def test_prometheus_scrapes_steps_and_gc_passes_while_the_engine_runs(tmp_path):
    require_prometheus()
    # With the API: its live stall detector finds the slow steps /metrics counts.
    api = ["--api-socket", str(tmp_path / "api.sock")]
    d = DaemonProcess(tmp_path, extra_args=["--metrics-listen", "127.0.0.1:0", *api]).start()
    prom = None
    engine = None
    try:
        port = metrics_port(d)
        prom = PrometheusServer(tmp_path, [f"127.0.0.1:{port}"]).start()
        stop_file = tmp_path / "stop"
        engine = subprocess.Popen(
            [sys.executable, str(ENGINE), d.socket, LABEL, str(stop_file), "200"],
            stdout=subprocess.PIPE,
            text=True,
        )
        steps = f'sum(stallscope_step_duration_seconds_count{{run_label="{LABEL}"}})'
        # Scraped while the engine runs: Prometheus sees steps before it stops.
        seen_running = wait_for(lambda: (prom.scalar(steps) or 0) > 0, 90, interval_s=0.5)
        assert seen_running, (prom.target_health(), d.new_log())
        assert engine.poll() is None, "the engine stopped before a scrape saw it"
        stop_file.touch()
        out, _ = engine.communicate(timeout=120)
        result = json.loads(out)
        made = sum(result["steps"].values())
        assert result["stats"]["drops_full"] == 0 and result["stats"]["drops_disconnected"] == 0

        # Every step reaches Prometheus: the scrape after the last decode.
        assert wait_for(lambda: prom.scalar(steps) == made, 60, interval_s=0.5), (
            prom.scalar(steps),
            made,
        )
        by_stage = prom.query(
            f'sum by (stage) (stallscope_step_duration_seconds_count{{run_label="{LABEL}"}})'
        )
        assert by_stage == {
            frozenset({("stage", "prefill")}): result["steps"]["prefill"],
            frozenset({("stage", "decode")}): result["steps"]["decode"],
        }
        # The histogram's +Inf bucket is its count; the sum is positive (2 ms sleeps).
        inf = prom.scalar(
            f'sum(stallscope_step_duration_seconds_bucket{{run_label="{LABEL}",le="+Inf"}})'
        )
        assert inf == made
        assert prom.scalar("sum(stallscope_step_duration_seconds_sum)") >= made * 0.002

        gen2 = 'sum(stallscope_gc_passes_total{generation="2"})'
        assert wait_for(
            lambda: (prom.scalar(gen2) or 0) >= result["forced_gen2"], 30, interval_s=0.5
        ), (prom.scalar(gen2), result["forced_gen2"])
        # The daemon's own final figures (every record is in by now), then
        # Prometheus catching up with them.
        direct = samples(scrape(port))
        final = {
            frozenset({("generation", g)}): total(
                direct, "stallscope_gc_passes_total", generation=g
            )
            for g in ("0", "1", "2")
            if total(direct, "stallscope_gc_passes_total", generation=g)
        }
        gc_query = "sum by (generation) (stallscope_gc_passes_total)"
        assert wait_for(lambda: prom.query(gc_query) == final, 30, interval_s=0.5), (
            prom.query(gc_query),
            final,
        )
        gc_by_gen = prom.query(gc_query)
        # Each forced gen-2 pass ran inside a step 10x its 2 ms baseline: a
        # slow step caused by GC (the detector needs 5 steps of history first,
        # and an unlucky sleep may make another cause win: at least half).
        slow_gc = 'sum(stallscope_slow_steps_total{cause="gc"})'
        want = total(samples(scrape(port)), "stallscope_slow_steps_total", cause="gc")
        assert want >= result["forced_gen2"] / 2, scrape(port)
        assert wait_for(lambda: prom.scalar(slow_gc) == want, 30, interval_s=0.5)
        pauses = prom.query("sum by (generation) (stallscope_gc_pause_seconds_count)")
        assert gc_by_gen == pauses
        assert all(h == "up" for h in prom.target_health())
        check_dashboard(prom, scrape(port))
    finally:
        if engine is not None and engine.poll() is None:
            engine.kill()
            engine.wait()
        if prom is not None:
            prom.stop()
        rc, _ = d.stop()
    assert rc == 0, d.read_log()

    # What Prometheus returned is what the database holds.
    db_steps = dict(
        d.query(
            "SELECT s.stage, count(*) FROM spans s JOIN runs r USING (run_id) "
            "WHERE s.kind = 'step' AND r.label = ? GROUP BY s.stage",
            [LABEL],
        )
    )
    assert db_steps == result["steps"]
    db_gc = dict(d.query("SELECT generation, count(*) FROM gc_events GROUP BY generation"))
    assert {frozenset({("generation", str(g))}): float(n) for g, n in db_gc.items()} == gc_by_gen
    assert db_gc[2] >= result["forced_gen2"]


def check_dashboard(prom, exposition):
    """Every query of the example Grafana dashboard is valid PromQL for this
    Prometheus, names only metrics the daemon exports, and the panels about
    steps, GC and the daemon show data."""
    board = json.loads(DASHBOARD.read_text())
    # Every family the daemon declares, with data or not (no GPU here).
    exported = set(re.findall(r"^# TYPE (\S+)", exposition, re.M))
    for panel in board["panels"]:
        for target in panel["targets"]:
            expr = (
                target["expr"]
                .replace("$instance", ".*")
                .replace("$run_label", ".*")
                .replace("$__rate_interval", "1m")
            )
            got = prom.query(expr)  # a parse error fails inside query()
            names = set(re.findall(r"\b(stallscope_[a-z_]+|DCGM_FI_[A-Z_]+)", expr))
            names = {re.sub(r"_(bucket|count|sum)$", "", n) for n in names}
            for name in names:
                assert name in exported, f"{panel['title']}: {name} is not exported"
            if panel["title"].startswith(MUST_HAVE_DATA) and target["refId"] == "A":
                assert got, f"{panel['title']}: {expr} has no data"
