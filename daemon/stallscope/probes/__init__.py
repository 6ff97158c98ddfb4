"""Probes the daemon runs beside probe ingest: kernel scheduling and GPU.

Each backend lives in its own module and implements `base.Probe`. `PROBES`
lists, per probe name, the backends from best to last resort; the daemon
starts the first whose `unavailable()` returns None, logs which one it took
and why the better ones were not usable, and records that in
`probe_status`. A missing kernel feature or driver is expected: it makes a
backend unavailable with a reason that says how to fix it, never an error.
"""

from stallscope.probes.base import Probe, ProbeSettings, Sink  # noqa: F401
from stallscope.probes.registry import PROBES, select_backend  # noqa: F401
