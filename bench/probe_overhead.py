"""Added time per engine step: no probe vs stallscope's probe vs a seed-style hook.

The toy engine (stallscope.demo.engine.ToyEngine: `_step` -> `_schedule`,
`executor.submit`, `ticket.collect`; no real work, so only instrumentation shows), timed in
interleaved rounds in one process so that machine noise hits all arms alike:

  none      the bare engine
  probe     probe_client.attach() on the four methods, a live daemon receiving
            (the C record write when it is built: probe_client.ACCELERATOR)
  probe-py  the same client kept on its Python record write
            (STALLSCOPE_PROBE_ACCEL=python), when the C write is built
  offline   the same with no daemon listening (records written, then dropped
            at the flush: the hot path without the send)
  seed      a hook like the seed's first one: a dict per row kept in a list,
            a closure per submission assigned to the ticket (a cycle each)

  base      with --baseline REF: the probe client of git revision REF (say,
            the previous release), attached the same way, in the same rounds,
            so a change to the hot path is measured side by side (with the C
            record write when REF's _accel.c is this tree's: the built
            extension is copied; else REF's Python write)

Prints the median per-step time of each arm over the rounds (each round's
mean) and the added time against `none`; with pacing also the median over
rounds of each round's median step, which a loaded machine's preemptions
do not move. Usage: python bench/probe_overhead.py [--steps N]
[--rounds R] [--baseline REF]
"""

import argparse
import array
import ctypes
import gc
import importlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import probe_client
from stallscope.demo.child import DaemonChild
from stallscope.demo.engine import Executor, NoWork, Ticket, ToyEngine

ROOT = Path(__file__).resolve().parent.parent


def seed_hook(engine):
    rows = []
    orig_step, orig_schedule, orig_submit = engine._step, engine._schedule, engine.executor.submit

    def step():
        t0 = time.perf_counter_ns()
        r = orig_step()
        rows.append({"kind": "step", "t0": t0, "t1": time.perf_counter_ns()})
        return r

    def schedule():
        t0 = time.perf_counter_ns()
        b = orig_schedule()
        rows.append(
            {
                "kind": "schedule",
                "t0": t0,
                "t1": time.perf_counter_ns(),
                "phase": b.phase,
                "batch": len(b.requests),
            }
        )
        return b

    def submit(batch):
        t0 = time.perf_counter_ns()
        ticket = orig_submit(batch)
        row = {"kind": "submit", "t0": t0, "t1": time.perf_counter_ns()}
        rows.append(row)
        collect = ticket.collect

        def timed_collect():
            c0 = time.perf_counter_ns()
            v = collect()
            row["collect"] = time.perf_counter_ns() - c0
            return v

        ticket.collect = timed_collect
        return ticket

    engine._step, engine._schedule, engine.executor.submit = step, schedule, submit
    return rows


def load_baseline(ref, into):
    """The probe_client package of git revision `ref`, imported as
    probe_client_base (its modules import each other relatively)."""
    pkg = into / "probe_client_base"
    pkg.mkdir()
    names = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{ref}:probe_client"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in names:
        if name.endswith(".py"):
            text = subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{ref}:probe_client/{name}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            (pkg / name).write_text(text)
    # The C record write of REF, when its source is this tree's: the built
    # extension is the same code, so the base arm times REF's glue around
    # the same C write (otherwise REF runs on its Python write).
    accel = ROOT / "probe_client" / "_accel.c"
    ref_accel = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{ref}:probe_client/_accel.c"],
        capture_output=True,
        text=True,
    )
    if ref_accel.returncode == 0 and accel.exists() and ref_accel.stdout == accel.read_text():
        for built in (ROOT / "probe_client").glob("_accel.*.so"):
            shutil.copy(built, pkg / built.name)
    sys.path.insert(0, str(into))
    return importlib.import_module("probe_client_base")


def thrasher(kib):
    """A function that writes over `kib` KiB (outside the timed step): the
    next step starts on caches another program's work has just filled, as
    after a model's forward pass. None when kib is 0."""
    if not kib:
        return None
    junk = bytearray(kib * 1024)
    address = ctypes.addressof((ctypes.c_char * len(junk)).from_buffer(junk))
    fill = ctypes.memset
    size = len(junk)

    def thrash(value):
        fill(address, value & 0xFF, size)

    thrash.keep = junk  # the buffer lives as long as the function
    return thrash


def time_steps(engine, steps, period_ns, each=None, thrash=None):
    """Mean ns inside `_step()`; steps start every `period_ns` (0: back to back).
    With `each` (an array of `steps` ints), paced steps' own durations go there too.

    Pacing matters: a real engine steps at most a few thousand times a second
    and the probe sends once per 20 ms, while a tight loop makes ~1 M records/s
    and measures socket back-pressure instead of the hot path."""
    step = engine._step
    clock = time.perf_counter_ns
    if not period_ns:
        t0 = clock()
        for _ in range(steps):
            step()
        return (clock() - t0) / steps
    inside = 0
    for i in range(steps):
        if thrash is not None:
            thrash(i)
        t0 = clock()
        step()
        t1 = clock()
        inside += t1 - t0
        each[i] = t1 - t0
        while clock() - t0 < period_ns:
            pass
    return inside / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument(
        "--period-us",
        type=float,
        default=100.0,
        help="one step every this many us (0: back to back)",
    )
    ap.add_argument("--baseline", metavar="REF", help="also time the probe client of git REF")
    ap.add_argument(
        "--thrash-kib",
        type=int,
        default=0,
        help="write over this many KiB before each paced step (cold caches, as after real work)",
    )
    ap.add_argument(
        "--no-daemon",
        action="store_true",
        help="every probe arm without a daemon (the hot path alone, no sends or decoding)",
    )
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stallscope-bench-"))
    daemon = None
    if not a.no_daemon:
        daemon = DaemonChild(
            tmp / "probe.sock",
            tmp / "bench.duckdb",
            tmp / "daemon.log",
            ["--sched-backend", "none", "--gpu-backend", "none"],
        ).start()
    sock = str(tmp / "nobody.sock") if daemon is None else daemon.socket
    probe = probe_client.connect(socket_path=sock, gc=True)
    arms = {"none": ToyEngine(), "probe": ToyEngine(), "offline": ToyEngine(), "seed": ToyEngine()}
    pyprobe = None
    if probe.accelerator != "python":
        os.environ["STALLSCOPE_PROBE_ACCEL"] = "python"
        pyprobe = probe_client.connect(socket_path=sock, gc=True)
        del os.environ["STALLSCOPE_PROBE_ACCEL"]
    offline = probe_client.connect(socket_path=str(tmp / "nobody.sock"), gc=True)

    class OfflineTicket(Ticket):  # its own collect, so only the offline probe wraps it
        collect = Ticket.collect

    class OfflineExecutor(Executor):
        ticket_class = OfflineTicket

    arms["offline"].executor = OfflineExecutor(NoWork())
    attach_to = [(probe, arms["probe"], Ticket), (offline, arms["offline"], OfflineTicket)]
    if pyprobe is not None:

        class PyTicket(Ticket):
            collect = Ticket.collect

        class PyExecutor(Executor):
            ticket_class = PyTicket

        arms["probe-py"] = ToyEngine(PyExecutor(NoWork()))
        attach_to.append((pyprobe, arms["probe-py"], PyTicket))
    base = None
    if a.baseline:
        base = load_baseline(a.baseline, tmp).connect(socket_path=sock, gc=True)

        class BaseTicket(Ticket):
            collect = Ticket.collect

        class BaseExecutor(Executor):
            ticket_class = BaseTicket

        arms["base"] = ToyEngine(BaseExecutor(NoWork()))
        attach_to.append((base, arms["base"], BaseTicket))
    for p, e, ticket in attach_to:
        p.attach(e, "_step", kind="step")
        p.attach(
            e, "_schedule", kind="schedule", stage="result.phase", batch="len(result.requests)"
        )
        p.attach(e, "executor.submit", kind="submit")
        p.attach(ticket, "collect", kind="collect")
    # The class-level collect wrapper times every Ticket; the other arms get
    # an unwrapped ticket class so that only the probe arm pays for it.

    class PlainTicket(Ticket):
        collect = Ticket.collect.__wrapped__

    class PlainExecutor(Executor):
        ticket_class = PlainTicket

    arms["none"].executor = PlainExecutor(NoWork())
    arms["seed"].executor = PlainExecutor(NoWork())
    seed_rows = seed_hook(arms["seed"])
    # A live arm's records are decoded by the daemon while the next arm runs:
    # each live arm (probe, base) follows an arm that sent nothing, so that
    # neither pays for the other's decoding.
    order = ["none", "probe", "offline"] + (["base"] if "base" in arms else []) + ["seed"]
    if "probe-py" in arms:  # after an arm that sent nothing, like the others
        order += ["probe-py"]
    arms = {k: arms[k] for k in order}
    results = {k: [] for k in arms}
    collections = {k: [0, 0, 0] for k in arms}
    # A step's own duration, median per round: unlike the mean, blind to the
    # few steps a loaded machine preempts (one 4 ms preemption adds 0.8 us to
    # the mean of a 5,000-step round).
    step_medians = {k: [] for k in arms}
    each = array.array("q", bytes(8 * a.steps))
    thrash = thrasher(a.thrash_kib)
    swapped = list(arms)
    if "base" in arms:  # every other round, probe and base trade places
        i, j = swapped.index("probe"), swapped.index("base")
        swapped[i], swapped[j] = swapped[j], swapped[i]
    for round_no in range(a.rounds):
        for name in swapped if round_no % 2 else list(arms):
            engine = arms[name]
            before = [s["collections"] for s in gc.get_stats()]
            results[name].append(time_steps(engine, a.steps, int(a.period_us * 1000), each, thrash))
            after = [s["collections"] for s in gc.get_stats()]
            for gen in range(3):
                collections[name][gen] += after[gen] - before[gen]
            if a.period_us:
                step_medians[name].append(statistics.median(each))
        seed_rows.clear()
    probe.close()
    offline.close()
    if pyprobe is not None:
        pyprobe.close()
    if base is not None:
        base.close()
    stored = "no daemon: none"
    if daemon is not None:
        daemon.stop()
        stored = daemon.scalar("SELECT count(*) FROM spans")
    med = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"steps per round {a.steps}, rounds {a.rounds}, one step every {a.period_us:g} us, "
        f"python {sys.version.split()[0]}, cpus {os.cpu_count()}, "
        f"probe record write: {probe.accelerator}, caches thrashed: {a.thrash_kib} KiB"
        + (f", base record write: {getattr(base, 'accelerator', 'python')}" if base else "")
    )
    steps_total = a.steps * a.rounds
    for name in arms:
        per_10k = [round(c * 10000 / steps_total, 1) for c in collections[name]]
        print(
            f"  {name:8s} median {med[name] / 1000:7.3f} us/step   added "
            f"{(med[name] - med['none']) / 1000:7.3f} us/step   GC passes per 10k steps "
            f"(gen0, gen1, gen2): {per_10k}"
        )
    if a.period_us:
        print("  median of each round's median step (robust to preemption):")
        smed = {k: statistics.median(v) for k, v in step_medians.items()}
        for name in arms:
            print(
                f"  {name:8s} median {smed[name] / 1000:7.3f} us/step   added "
                f"{(smed[name] - smed['none']) / 1000:7.3f} us/step"
            )
    st = probe.stats()
    print(
        f"  probe: {st['sent_records']} records sent, {st['drops_full']} dropped (socket "
        f"full), {stored} stored by the daemon"
    )
    return 0


if __name__ == "__main__":
    gc.collect()
    sys.exit(main())
