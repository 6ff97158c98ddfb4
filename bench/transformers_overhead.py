"""Time the probe adds per step on a real loop: transformers' continuous batching.

One process, one continuous-batching manager (the tiny random-weight Llama
of stallscope/demo/transformers_engine.py, torch on one thread), one probe
connected to a live daemon, the `transformers` preset attached (step,
schedule, forward, update: four wrapped calls per step). A minimal timer
(two clock reads) sits outermost on `_generation_loop_body` and, before
each iteration, switches the four methods between the probe's wrappers and
the originals, in the pattern untraced, traced, traced, untraced, ... so
that neighbouring steps (same batch, nearly the same context) are compared
and neither arm is always the later one. The probe's added time per step is
the median over pairs of busy neighbours with the same batch size of
(traced - untraced); it is also given as a share of the median untraced
step. Usage: python bench/transformers_overhead.py [--rounds R] [--requests N]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

import probe_client
from probe_client import _autoattach, _specs
from stallscope.demo.child import DaemonChild

ROOT = Path(__file__).resolve().parent.parent

_mono = time.monotonic_ns
_cpu = time.thread_time_ns  # the generation thread's CPU time: blind to preemption


# --sink: accept every connection and discard every datagram (no decoding).
SINK = """
import os, select, socket, sys
srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
srv.bind(sys.argv[1] + ".tmp")
srv.listen(16)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
socks = [srv]
while True:
    for s in select.select(socks, [], [])[0]:
        if s is srv:
            socks.append(srv.accept()[0])
        elif not s.recv(65536):
            socks.remove(s)
            s.close()
"""


def preset_specs():
    data = _specs.load_toml(str(ROOT / "presets" / "transformers.toml"))
    specs, errors = _specs.specs_from_toml(data, "transformers.toml")
    assert not errors, errors
    return specs


class Switch:
    """The four preset targets: (class, name, original, wrapper)."""

    def __init__(self, targets):
        self.targets = targets

    def use(self, traced):
        for cls, name, original, wrapper in self.targets:
            if name != "_generation_loop_body":  # the timer calls that one itself
                setattr(cls, name, wrapper if traced else original)


def attach_switchable(probe, specs):
    """Attach the preset and return a Switch between wrappers and originals."""
    import importlib

    found = []
    for spec in specs:
        module = importlib.import_module(spec.module)
        cls_name, name = spec.path.rsplit(".", 1)
        cls = getattr(module, cls_name)
        found.append((cls, name, cls.__dict__[name]))
    hooks = _autoattach.Hooks(probe)
    hooks.add(specs)  # the modules are imported: attached at once
    assert len(hooks.attached) == len(specs), "preset did not attach"
    return Switch([(cls, name, orig, cls.__dict__[name]) for cls, name, orig in found])


def _passthrough(original):
    def plain(*args, **kwargs):
        return original(*args, **kwargs)

    return plain


def install_timer(cls, switch, out):
    """Our outermost timer on the loop body, switching arms step by step."""
    body = next(t for t in switch.targets if t[1] == "_generation_loop_body")
    original, wrapper = body[2], body[3]
    counter = [0]

    def timed(self, batch_processor, bootstrapping):
        n = counter[0]
        counter[0] = n + 1
        traced = n % 4 in (1, 2)
        switch.use(traced)
        inner = wrapper if traced else original
        before = self.current_batch
        c0 = _cpu()
        t0 = _mono()
        keep_going = inner(self, batch_processor, bootstrapping)
        t1 = _mono()
        c1 = _cpu()
        busy = self.current_batch != before  # a forward ran
        io = batch_processor.inputs_and_outputs
        out.append((n, traced, busy, io.num_request_in_batch, t1 - t0, c1 - c0))
        return keep_going

    cls._generation_loop_body = timed


def pair_differences(steps, field):
    """(traced - untraced) ns for each pair (4k, 4k+1) and (4k+2, 4k+3) of
    busy neighbours with the same batch, and the untraced durations;
    `field` 4: wall time, 5: the thread's CPU time."""
    by_n = {row[0]: row for row in steps}
    diffs, untraced = [], []
    for n in range(0, max(by_n) + 1, 2):
        a, b = by_n.get(n), by_n.get(n + 1)
        if not a or not b or not (a[2] and b[2]) or a[3] != b[3]:
            continue
        t, u = (a, b) if a[1] else (b, a)
        diffs.append(t[field] - u[field])
        untraced.append(u[field])
    return diffs, untraced


def one_round(manager, prompts, new_tokens):
    ids = [manager.add_request(p, max_new_tokens=new_tokens) for p in prompts]
    for _ in ids:
        manager.get_result(timeout=60)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        help="one more argument of the daemon (repeatable), e.g. --daemon-arg=--no-cpu-sampler "
        "--daemon-arg=--kernel-causes=none: which probe's kernel side costs the engine what",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="METHOD",
        help="switch only these preset methods (repeatable): which costs what",
    )
    parser.add_argument(
        "--plain-wrappers",
        action="store_true",
        help="a plain Python pass-through wrapper instead of the probe's: what any wrapper costs",
    )
    parser.add_argument(
        "--same-arms",
        action="store_true",
        help="both arms untraced: the method's own bias and noise (should be ~0)",
    )
    parser.add_argument(
        "--python-write",
        action="store_true",
        help="keep the probe on its Python record write (STALLSCOPE_PROBE_ACCEL=python)",
    )
    parser.add_argument(
        "--no-daemon",
        action="store_true",
        help="no daemon listening: records are written, then dropped (no sends, no decoding)",
    )
    parser.add_argument(
        "--sink",
        action="store_true",
        help="a process that only receives and discards the datagrams instead of the daemon: "
        "the sends without the daemon's decoding and storing",
    )
    args = parser.parse_args()
    if args.python_write:
        os.environ["STALLSCOPE_PROBE_ACCEL"] = "python"

    import torch
    from transformers import GenerationConfig
    from transformers.generation.continuous_batching.continuous_api import (
        ContinuousBatchingManager,
    )

    from stallscope.demo import transformers_engine as eng

    torch.set_num_threads(1)
    model = eng.tiny_llama()
    config = GenerationConfig(
        max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    cb = eng.batching_config()
    prompts = eng.prompts(args.requests)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        db = tmp / "bench.duckdb"
        daemon = DaemonChild(
            tmp / "probe.sock",
            db,
            tmp / "daemon.log",
            ["--sched-backend", "none", "--gpu-backend", "none", *args.daemon_arg],
        ).start()
        manager = model.init_continuous_batching(
            generation_config=config, continuous_batching_config=cb
        )
        sock = str(tmp / "nobody.sock") if args.no_daemon else daemon.socket
        sink = None
        if args.sink:
            sock = str(tmp / "sink.sock")
            sink = subprocess.Popen([sys.executable, "-c", SINK, sock])
            while not os.path.exists(sock):
                time.sleep(0.01)
        probe = probe_client.connect(socket_path=sock, run_label="bench-transformers")
        switch = attach_switchable(probe, preset_specs())
        if args.same_arms:
            switch.targets = [(c, n, o, o) for c, n, o, _ in switch.targets]
        if args.plain_wrappers:
            switch.targets = [(c, n, o, _passthrough(o)) for c, n, o, _ in switch.targets]
        if args.only:
            switch.targets = [
                (c, n, o, w if n in args.only else o) for c, n, o, w in switch.targets
            ]
        steps = []
        install_timer(ContinuousBatchingManager, switch, steps)
        manager.start()
        try:
            one_round(manager, prompts, args.new_tokens)  # warm-up
            del steps[:]
            for r in range(args.rounds):
                first = len(steps)
                one_round(manager, prompts, args.new_tokens)
                line = f"round {r + 1}:"
                for field, what in ((4, "wall"), (5, "cpu")):
                    diffs, untraced = pair_differences(steps[first:], field)
                    line += (
                        f"  {what}: step {statistics.median(untraced) / 1e3:7.1f} us,"
                        f" added {statistics.median(diffs) / 1e3:6.1f} us"
                    )
                print(line, flush=True)
        finally:
            manager.stop(block=True, timeout=10)
            probe.close()
            daemon.stop()
            if sink is not None:
                sink.kill()
                sink.wait()
        con = duckdb.connect(str(db), read_only=True)
        stored = con.execute(
            "SELECT count(*) FROM spans WHERE kind = 'step' AND batch > 0"
        ).fetchone()[0]
        con.close()
    for field, what in ((4, "wall time"), (5, "CPU time of the step's thread")):
        diffs, untraced = pair_differences(steps, field)
        added, step = statistics.median(diffs), statistics.median(untraced)
        print(
            f"{what}: median untraced step {step / 1e3:.1f} us; added {added / 1e3:.1f} us "
            f"per step = {100 * added / step:.2f}% of the step ({len(diffs)} pairs)"
        )
    print(f"rounds: {args.rounds}; busy traced steps stored by the daemon: {stored}")
    print(
        f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}, threads 1; "
        f"probe record write: {probe.accelerator}; daemon: {'no' if args.no_daemon else 'sink' if args.sink else 'yes'}"
    )


if __name__ == "__main__":
    main()
