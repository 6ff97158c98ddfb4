"""The GPU probe on a real Store, for the GPU probe tests."""

from stallscope.probes import gpu_nvml
from stallscope.probes.base import ProbeSettings
from stallscope.service.server import StoreSink


def make_probe(store, **settings):
    probe = gpu_nvml.NvmlGpuProbe(ProbeSettings(**settings))
    probe.open(StoreSink(store))
    return probe


def rows(store, sql, params=None):
    store.flush()
    return store.cursor().execute(sql, params or []).fetchall()
