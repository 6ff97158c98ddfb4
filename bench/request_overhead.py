"""Per-call cost of request events: probe.request and probe.request_tokens against a bare loop.

Arms, timed in interleaved rounds in one process so that machine noise hits
all of them alike, each a loop of `--calls` iterations:

  bare          the loop with a no-op call of the same shape (a Python
                function taking the same arguments)
  int token     probe.request(i, "token", tokens=1): an int id
  str token     probe.request(str_id, "token"): a str id, hashed in the call
  str arrived   probe.request(str_id, "arrived"): hashed, and its text written
  batch 256     probe.request_tokens(ids, 1) for 256 int ids: the figure is
                per request of the batch (the loop time / 256)
  batch 256 str the same with 256 str ids
  batch 256 py  `batch 256` on a probe kept on the Python record write
                (STALLSCOPE_PROBE_ACCEL=python), when the C write is built

A live daemon receives everything (the engine's side of a send is part of the
cost; --no-daemon leaves it out). Prints, per arm, the median over rounds of
its mean ns per call and the time added against `bare` (per request for the
batches). GC is left on, as in an engine. Usage: python
bench/request_overhead.py [--calls N] [--rounds R] [--no-daemon]
"""

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import probe_client
from stallscope.demo.child import DaemonChild

BATCH = 256


def _noop(request_id, event, tokens=None):
    return None


def _noop_batch(ids, counts):
    return None


def arms(probe, calls, pyprobe=None):
    """name -> (function timing one round: ns per call, calls per iteration)."""
    str_ids = [f"cmpl-{i:032x}-0" for i in range(BATCH)]
    int_ids = list(range(1_000_000, 1_000_000 + BATCH))
    clock = time.perf_counter_ns

    def loop(fn, ids, event, tokens):
        def run():
            n = len(ids)
            t0 = clock()
            for i in range(calls):
                fn(ids[i % n], event, tokens)
            return (clock() - t0) / calls

        return run

    def batch(fn, ids):
        def run():
            n = max(1, calls // BATCH)
            t0 = clock()
            for _ in range(n):
                fn(ids, 1)
            return (clock() - t0) / (n * BATCH)

        return run

    out = {
        "bare": (loop(_noop, int_ids, "token", 1), 1),
        "int token": (loop(probe.request, int_ids, "token", 1), 1),
        "str token": (loop(probe.request, str_ids, "token", None), 1),
        "str arrived": (loop(probe.request, str_ids, "arrived", None), 1),
        "bare batch": (batch(_noop_batch, int_ids), BATCH),
        "batch 256": (batch(probe.request_tokens, int_ids), BATCH),
        "batch 256 str": (batch(probe.request_tokens, str_ids), BATCH),
    }
    if pyprobe is not None:
        out["batch 256 py"] = (batch(pyprobe.request_tokens, int_ids), BATCH)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--no-daemon", action="store_true")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stallscope-bench-"))
    daemon = None
    if not a.no_daemon:
        daemon = DaemonChild(
            tmp / "probe.sock",
            tmp / "bench.duckdb",
            tmp / "daemon.log",
            ["--sched-backend", "none", "--gpu-backend", "none", "--no-kernel-causes"],
        ).start()
    sock = str(tmp / "nobody.sock") if daemon is None else daemon.socket
    probe = probe_client.connect(socket_path=sock, gc=True)
    pyprobe = None
    if probe.accelerator != "python":
        os.environ["STALLSCOPE_PROBE_ACCEL"] = "python"
        pyprobe = probe_client.connect(socket_path=sock, gc=True)
        del os.environ["STALLSCOPE_PROBE_ACCEL"]
    timed = arms(probe, a.calls, pyprobe)
    results = {name: [] for name in timed}
    try:
        for _ in range(a.rounds):
            for name, (run, _) in timed.items():
                results[name].append(run())
            # the flusher sends what a round left; the next round starts with
            # an empty buffer, as an engine's next step does
            probe.flush()
            if pyprobe is not None:
                pyprobe.flush()
            time.sleep(0.05)
        stats = probe.stats()
    finally:
        probe.close()
        if pyprobe is not None:
            pyprobe.close()
        if daemon is not None:
            daemon.stop()
    med = {name: statistics.median(v) for name, v in results.items()}
    print(
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{a.rounds} rounds of {a.calls} calls, "
        f"{'no daemon' if daemon is None else 'live daemon'}, accelerator {probe.accelerator}"
    )
    print(f"{'arm':<16}{'ns/call':>10}{'added ns':>10}")
    for name, v in med.items():
        base = (
            med["bare batch"] if name.startswith("batch") or name == "bare batch" else med["bare"]
        )
        added = "" if name.startswith("bare") else f"{v - base:10.1f}"
        print(f"{name:<16}{v:10.1f}{added:>10}")
    print(
        f"sent {stats['sent_records']} records, dropped {stats['drops_full']} (socket full), "
        f"{stats['drops_disconnected']} (no daemon), errors {stats['errors']}"
    )


if __name__ == "__main__":
    main()
