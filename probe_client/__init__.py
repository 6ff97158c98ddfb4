"""stallscope's in-process probe client: GC and engine-step markers for the daemon.

Usage::

    import probe_client
    probe = probe_client.connect(run_label="huginn-bf16")
    probe.attach(engine, "_step", kind="step")
    probe.attach(engine, "_schedule", kind="schedule",
                 stage="result.phase", batch="len(result.requests)")
    probe.attach(engine, "executor.submit", kind="submit")
    probe.attach(Ticket, "collect", kind="collect")   # a class: every ticket

`connect()` never raises because the daemon is absent, and nothing the probe
does on the engine's hot path raises, blocks, or leaves garbage behind (see
`_probe.py`). Standard library only.
"""

from ._expr import ExprError
from ._probe import DEFAULT_SOCKET, SOCKET_ENV, Probe
from ._wrap import AttachError

__all__ = ["connect", "Probe", "AttachError", "ExprError", "DEFAULT_SOCKET", "SOCKET_ENV"]


def connect(socket_path=None, run_label=None, gc=True):
    """Start a run: socket_path defaults to $STALLSCOPE_SOCKET, else
    /run/stallscope/probe.sock; gc=True records every collection."""
    return Probe(socket_path=socket_path, run_label=run_label, gc=gc)
