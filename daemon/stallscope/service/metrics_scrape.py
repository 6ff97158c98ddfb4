"""The /metrics families read when Prometheus scrapes, not folded from batches.

Records received, stored, lost and rejected, probe states, connections,
the daemon's own CPU and memory (`selfstats`), and the GPU gauges (from the
latest values `metrics.Metrics` kept) under DCGM exporter's names. Each call
reads counters the daemon already keeps, plus one small query of
`probe_status` on a read cursor; it never writes and never takes a lock a
producer holds for long.
"""

import logging

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from stallscope.service import selfstats
from stallscope.vocab.gpu_reasons import CLOCK_EVENT_REASONS
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

# NVML fields exported under DCGM exporter's names (same meaning, same unit
# once converted): (column, DCGM name, help, scale).
GPU_FIELDS = (
    ("sm_clock_mhz", "DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", 1.0),
    ("mem_clock_mhz", "DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", 1.0),
    ("power_mw", "DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", 0.001),
    ("temp_c", "DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", 1.0),
    ("util_pct", "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", 1.0),
    ("mem_util_pct", "DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", 1.0),
    (
        "clock_event_reasons",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "Current clock event reasons (bitmask of NVML clocks event reasons).",
        1.0,
    ),
)


def daemon_families(d):
    """Families read from the daemon at scrape time."""
    ing = d.ingest.status()
    store = d.store
    yield counter(
        "stallscope_records_received",
        "Records received from probe clients.",
        None,
        ing.get("records_received", 0),
    )
    yield counter(
        "stallscope_rows_stored", "Rows written to the database.", None, store.rows_written
    )
    yield counter(
        "stallscope_records_lost",
        "Records known lost: 'client' (dropped before reaching the daemon), "
        "'store' (rows the database would not take).",
        "where",
        {"client": ing.get("lost_records", 0), "store": store.rows_lost},
    )
    yield counter(
        "stallscope_records_rejected",
        "Records ingest refused, by reason (a fixed set of codes).",
        "reason",
        ing.get("rejections", {}),
    )
    yield gauge(
        "stallscope_rows_pending", "Rows queued for the database.", None, store.pending_rows
    )
    yield gauge(
        "stallscope_connections",
        "Probe client connections open.",
        None,
        ing.get("connections", 0),
    )
    states = GaugeMetricFamily(
        "stallscope_probe_state",
        "1 for each probe's current state (active, unavailable, failed, stopped) and backend.",
        labels=["probe", "backend", "state"],
    )
    for probe, backend, state in _probe_states(d):
        states.add_metric([probe, backend, state], 1.0)
    yield states
    yield counter(
        "stallscope_daemon_cpu_seconds",
        "CPU time the daemon used (user + system).",
        None,
        selfstats.cpu_seconds(),
    )
    rss = selfstats.rss_bytes(getattr(getattr(d, "settings", None), "proc_root", "/proc"))
    if rss is not None:
        yield gauge(
            "stallscope_daemon_resident_memory_bytes",
            "The daemon's resident set size.",
            None,
            rss,
        )


def _probe_states(daemon):
    try:
        cur = daemon.store.cursor()
        try:
            rows = cur.execute(
                "SELECT probe, backend, state FROM probe_status QUALIFY row_number() "
                "OVER (PARTITION BY probe ORDER BY ts_ns DESC) = 1 ORDER BY probe"
            ).fetchall()
        finally:
            cur.close()
    except Exception as exc:
        log.debug("metrics: probe states unavailable: %s", exc)
        rows = []
    seen = {r[0] for r in rows}
    out = [(p, b or "", s or "") for p, b, s in rows]
    for probe in getattr(daemon, "probes", []):  # started, not yet flushed
        if probe.name not in seen:
            out.append((probe.name, probe.backend or "", "active"))
    return out


def counter(name, doc, label, values):
    fam = CounterMetricFamily(name, doc, labels=[label] if label else None)
    if label is None:
        fam.add_metric([], float(values))
    else:
        for key, value in sorted(values.items()):
            fam.add_metric([str(key)], float(value))
    return fam


def gauge(name, doc, label, value):
    fam = GaugeMetricFamily(name, doc, labels=[label] if label else None)
    fam.add_metric([], float(value))
    return fam


def hang_families(d, labels):
    """The hang watchdog's counters and, per run label, seconds since a step ended."""
    hangs = getattr(d, "hangs", None)
    if hangs is None:
        return
    info = hangs.summary()
    yield counter(
        "stallscope_hangs",
        "Hang episodes: a run with no step end for longer than its threshold while busy.",
        None,
        info["hangs_total"],
    )
    yield counter(
        "stallscope_hang_dumps",
        "Hang episodes by what became of their dump: 'taken', 'rate_limited', 'failed'.",
        "outcome",
        {
            "taken": info["dumps_taken"],
            "rate_limited": info["dumps_rate_limited"],
            "failed": info["capture_errors"],
        },
    )
    fam = GaugeMetricFamily(
        "stallscope_seconds_since_last_step",
        "Seconds since the latest step end of each connected run, by run label "
        "(the largest of the runs sharing a label).",
        labels=["run_label"],
    )
    worst = {}
    for run_id, seconds in info["seconds_since_step"].items():
        label = labels.get(run_id, "")
        worst[label] = max(worst.get(label, 0.0), seconds)
    for label, seconds in sorted(worst.items()):
        fam.add_metric([label], seconds)
    yield fam


def gpu_families(gpu):
    for column, name, doc, scale in GPU_FIELDS:
        fam = GaugeMetricFamily(name, doc, labels=["gpu"])
        for index, values in sorted(gpu.items()):
            if column in values:
                fam.add_metric([str(index)], values[column] * scale)
        yield fam
    reasons = GaugeMetricFamily(
        "stallscope_gpu_clock_event_reason",
        "1 while NVML reports this clock-event reason for the GPU (latest sample), else 0.",
        labels=["gpu", "reason"],
    )
    for index, values in sorted(gpu.items()):
        mask = values.get("clock_event_reasons")
        if mask is None:
            continue
        for bit, (reason, _) in CLOCK_EVENT_REASONS.items():
            reasons.add_metric([str(index), reason], 1.0 if mask & bit else 0.0)
    yield reasons
