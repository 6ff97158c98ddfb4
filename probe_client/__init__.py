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
    probe.request("req-17", "arrived")                # request lifecycle events
    probe.request_tokens(batch_ids, 1)                # a token for each, this step

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
from ._requests import request_key
from ._wrap import AttachError

__all__ = [
    "connect",
    "Probe",
    "AttachError",
    "ExprError",
    "ACCELERATOR",
    "DEFAULT_SOCKET",
    "SOCKET_ENV",
    "request_key",
]


def connect(
    socket_path=None,
    run_label=None,
    gc=True,
    close_wait_ms=None,
    census=None,
    census_after_s=None,
    census_top=None,
    gc_freeze_after_s=None,
    gc_threshold=None,
    pythreads=None,
):
    """Start a run: socket_path defaults to $STALLSCOPE_SOCKET, else
    /run/stallscope/probe.sock; gc=True records every collection;
    close_wait_ms bounds close()'s (and exit's) wait for socket space
    (default $STALLSCOPE_CLOSE_WAIT_MS, else 300; 0 disables).

    census=True (default: $STALLSCOPE_CENSUS=1) sends a type histogram of
    the GC-tracked heap at connect (or at `probe.mark("warm")`, or
    census_after_s seconds later) and at close: the top census_top types
    (default 30). gc_threshold=(A, B, C) sets gc.set_threshold now;
    gc_freeze_after_s=S runs gc.collect() then gc.freeze() S seconds after
    connect. Both are recorded with the run; a bad value raises ValueError.

    pythreads=True (default, unless $STALLSCOPE_PYTHREADS=0) lets the
    daemon's CPU sampler name Python frames: the background flusher checks
    this interpreter's frame layout once and sends it, then the list of its
    thread states whenever it changes (never on the hot path; an interpreter
    it does not know is said once per connection, and nothing more is sent)."""
    return Probe(
        socket_path=socket_path,
        run_label=run_label,
        gc=gc,
        close_wait_ms=close_wait_ms,
        census=census,
        census_after_s=census_after_s,
        census_top=census_top,
        gc_freeze_after_s=gc_freeze_after_s,
        gc_threshold=gc_threshold,
        pythreads=pythreads,
    )
