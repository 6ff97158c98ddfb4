"""stallscope's in-process probe client: GC and engine-step markers for the daemon.

Usage::

    import probe_client
    probe = probe_client.connect(run_label="huginn-bf16")
    probe.attach(engine, "_step", kind="step")
    probe.attach(engine, "_schedule", kind="schedule",
                 stage="result.phase", batch="len(result.requests)")
    probe.attach(engine, "executor.submit", kind="submit")
    probe.attach(Ticket, "collect", kind="collect")   # a class: every ticket
    probe.attach(engine, "_loop_body", kind="step", work="arg0.num_tokens",
                 idle="len(arg0.requests) == 0")

`connect()` never raises because the daemon is absent, and nothing the probe
does on the engine's hot path raises, blocks, or leaves garbage behind (see
`_probe.py`); `attach()` raises `AttachError` or `ExprError`, at set-up, for
what it cannot wrap safely. Standard library only; `ACCELERATOR` says
whether the optional C record write (`_accel.c`, built at install when a
compiler is there) is in use ("c") or not ("python"), and `probe.accelerator`
says it for one probe.
"""

from ._expr import ExprError
from ._probe import ACCELERATOR, DEFAULT_SOCKET, SOCKET_ENV, Probe
from ._wrap import AttachError

__all__ = [
    "connect",
    "Probe",
    "AttachError",
    "ExprError",
    "ACCELERATOR",
    "DEFAULT_SOCKET",
    "SOCKET_ENV",
]


def connect(socket_path=None, run_label=None, gc=True, close_wait_ms=None):
    """Start a run: socket_path defaults to $STALLSCOPE_SOCKET, else
    /run/stallscope/probe.sock; gc=True records every collection;
    close_wait_ms bounds close()'s (and exit's) wait for socket space
    (default $STALLSCOPE_CLOSE_WAIT_MS, else 100; 0 disables)."""
    return Probe(socket_path=socket_path, run_label=run_label, gc=gc, close_wait_ms=close_wait_ms)
