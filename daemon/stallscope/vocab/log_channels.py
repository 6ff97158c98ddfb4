"""The daemon's log channels: the logger names its journal lines carry.

Users grep the journal for these (`journalctl -u stallscope | grep
stallscope.store`), and tests wait for lines on them, so they keep their
names when a module moves: `CHANNELS` maps a module to its documented
channel (docs/systemd.md, "Log channels"), and every other module logs
under its own `__name__`. tests/test_layout.py checks that each module asks
here (or uses `__name__`), that each key is a module that exists, and that
docs/systemd.md lists each channel.
"""

# module -> channel
CHANNELS = {
    "stallscope.api.server": "stallscope.api",
    "stallscope.cli.daemon": "stallscope.daemon",
    "stallscope.ingest.listener": "stallscope.ingest",
    "stallscope.ingest.requests": "stallscope.hang",
    "stallscope.ingest.runs": "stallscope.ingest",
    "stallscope.ingest.sockets": "stallscope.daemon",
    "stallscope.probes.bpf_probe": "stallscope.probes.bpf",
    "stallscope.probes.gpu_nvml": "stallscope.probes.gpu",
    "stallscope.probes.registry": "stallscope.probes",
    "stallscope.service.deep": "stallscope.deep",
    "stallscope.service.export": "stallscope.export",
    "stallscope.service.hang": "stallscope.hang",
    "stallscope.service.metrics": "stallscope.metrics",
    "stallscope.service.metrics_http": "stallscope.metrics",
    "stallscope.service.metrics_scrape": "stallscope.metrics",
    "stallscope.service.placement": "stallscope.daemon",
    "stallscope.service.selfstats": "stallscope.selfstats",
    "stallscope.service.server": "stallscope.daemon",
    "stallscope.service.systemd.endpoint": "stallscope.daemon",
    "stallscope.service.systemd.notify": "stallscope.notify",
    "stallscope.service.systemd.reload": "stallscope.reload",
    "stallscope.service.watch": "stallscope.watch",
    "stallscope.store.alerts": "stallscope.api.alerts",
    "stallscope.store.database": "stallscope.store",
    "stallscope.store.migrations": "stallscope.store",
    "stallscope.store.recovery": "stallscope.store",
    "stallscope.store.retention": "stallscope.retention",
    "stallscope.store.step_fill": "stallscope.step_fill",
    "stallscope.store.views": "stallscope.views",
    "stallscope.threads": "stallscope.daemon",
}


def log_channel(module):
    """The logger name for `module` (its `__name__`)."""
    return CHANNELS.get(module, module)
