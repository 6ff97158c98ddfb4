"""The demo's scenario: the engine (demo/engine.py) traced as a user would trace it.

`run_scenario` feeds the engine requests from a fixed, seeded arrival trace
and instruments it with `probe.attach()` from outside. `--gc-pressure` adds the
seed's buggy timing hook (a closure on each ticket that references the ticket,
so one reference cycle per submission, held briefly in a pending list) on top
of a large long-lived heap, which makes a gen-2 collection appear in steady
state; without it none does. `inject` makes chosen steps slow for a known
reason (preemption, blocking, submit delay, GC) and records which, for the
attribution tests.
"""

import gc
import json
import os
import random
import sys
import threading
import time
import weakref
from collections import deque

from stallscope.demo.engine import Engine, Request, StageWork, Ticket


class LeakyStepTimer:
    """The seed's first timing hook, reproduced on purpose (--gc-pressure).

    It wraps `executor.submit`, keeps a per-call row dict, and replaces each
    ticket's `collect` with a closure that references the ticket: one
    reference cycle per submission. Rows stay in a pending list for a while,
    so the cycles survive young collections and pile up in generation 2 until
    a full collection runs over the whole heap. `objects_per_s` sets how fast
    garbage reaches generation 2 (so the demo's gen-2 pass lands at a chosen
    point of the run)."""

    def __init__(self, engine, objects_per_s, pending=400):
        self.engine = engine
        self.objects_per_s = objects_per_s
        self.pending = deque(maxlen=pending)
        self._last = time.perf_counter()
        self._orig_submit = engine.executor.submit
        engine.executor.submit = self.timed_submit

    def timed_submit(self, batch):
        t0 = time.perf_counter()
        ticket = self._orig_submit(batch)
        extra = int((t0 - self._last) * self.objects_per_s)
        self._last = t0
        row = {
            "phase": batch.phase,
            "batch": len(batch.requests),
            "t0": t0,
            "ticket": ticket,
            "payload": [[i] for i in range(min(extra, 5000))],
        }
        collect = ticket.collect

        def timed_collect():
            result = collect()
            row["t1"] = time.perf_counter()
            self.pending.append(row)
            return result

        ticket.collect = timed_collect
        return ticket


def build_heap(objects):
    """Long-lived objects standing in for a loaded model's Python heap."""
    return [[i] for i in range(objects)]


def arrival_trace(rate, duration_s, seed=0):
    rng = random.Random(seed)
    t, out = 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        out.append(t)


def _spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Injector:
    """Makes chosen steps slow for a known reason and writes down which.

    Every `every`-th step gets the next cause in `causes`, inside the step:
    'block' (a sleep), 'submit' (host work inside executor.submit), 'gc' (a
    full collection), 'preempt' (a SCHED_FIFO process pinned to the engine's
    CPU wakes and spins, so the engine thread is preempted, not blocked).
    Each injected step is logged as JSON: cause, start_ns, end_ns, tid."""

    def __init__(self, engine, causes, every, extra_ms, log_path):
        # engine._step becomes this injector's method, so the injector holds
        # the engine weakly and the class's function, never a method bound to
        # the engine: no reference cycle (probe_client's attach() refuses one).
        self.engine = weakref.proxy(engine)
        self.causes = list(causes)
        self.every = every
        self.extra_s = extra_ms / 1000.0
        self.log = open(log_path, "w") if log_path else None
        self.i = 0
        self._orig_step = type(engine)._step
        engine._step = self._step
        self._hog_pid = None
        self._hog_fd = None
        if "preempt" in self.causes:
            self._start_hog()

    def _start_hog(self):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})  # the engine thread stays on `cpu`
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the hog: waits on the pipe, then spins on our CPU
            try:
                os.close(w)
                os.sched_setaffinity(0, {cpu})
                try:
                    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
                except PermissionError:
                    os.nice(-20)
                while True:
                    b = os.read(r, 1)
                    if not b:
                        break
                    _spin(self.extra_s)
            finally:
                os._exit(0)
        os.close(r)
        self._hog_pid, self._hog_fd = pid, w

    def _step(self):
        n = self.engine.steps
        if n == 0 or n % self.every:
            return self._orig_step(self.engine)
        cause = self.causes[self.i % len(self.causes)]
        self.i += 1
        t0 = time.monotonic_ns()
        if cause == "submit":
            self.engine.executor.submit_extra_s = self.extra_s
        elif cause == "preempt":
            os.write(self._hog_fd, b"x")
        elif cause == "gc":
            gc.collect(2)
        elif cause == "block":
            time.sleep(self.extra_s)
        result = self._orig_step(self.engine)
        t1 = time.monotonic_ns()
        if self.log:
            self.log.write(
                json.dumps(
                    {"cause": cause, "start_ns": t0, "end_ns": t1, "tid": threading.get_native_id()}
                )
                + "\n"
            )
            self.log.flush()
        return result

    def close(self):
        if self._hog_fd is not None:
            os.close(self._hog_fd)
            os.waitpid(self._hog_pid, 0)
        if self.log:
            self.log.close()


def run_scenario(
    socket_path,
    duration_s=45.0,
    rate=1.0,
    gc_pressure=False,
    heap_objects=None,
    warmup_s=None,
    label="demo",
    progress=None,
    inject=None,
    inject_every=50,
    inject_ms=15.0,
    inject_log=None,
    seed=0,
    submit_jitter=(0.0, 0.0),
    census=False,
    gc_freeze_after_s=None,
):
    """Run the engine for `duration_s`, traced through `socket_path`."""
    import probe_client

    work = StageWork()
    engine = Engine(work, submit_jitter)
    heap = None
    if heap_objects is None:
        heap_objects = 400_000 if gc_pressure else 0
    if heap_objects:
        heap = build_heap(heap_objects)
    gc.collect()
    warmup_s = warmup_s if warmup_s is not None else min(10.0, 0.2 * duration_s)
    window_s = duration_s - warmup_s

    injector = None
    if inject:  # before attach(), so that injected causes fall inside the step span
        injector = Injector(engine, inject, inject_every, inject_ms, inject_log)
    probe = probe_client.connect(
        socket_path=socket_path,
        run_label=label,
        census=census,
        gc_freeze_after_s=gc_freeze_after_s,
    )
    probe.attach(engine, "_step", kind="step")
    probe.attach(
        engine, "_schedule", kind="schedule", stage="result.phase", batch="len(result.requests)"
    )
    probe.attach(engine, "executor.submit", kind="submit")
    probe.attach(Ticket, "collect", kind="collect")

    leaky = None
    if gc_pressure:
        # Garbage must reach a quarter of the long-lived heap for CPython to
        # run a full collection; aim for ~60% into the measurement window.
        tracked = len(gc.get_objects())
        target_s = warmup_s + 0.6 * window_s
        leaky = LeakyStepTimer(engine, objects_per_s=tracked / 4 / max(1.0, target_s))

    arrivals = deque(arrival_trace(rate, duration_s, seed))
    rid = 0
    start = time.monotonic()
    window_t0 = None
    last_progress = 0.0
    try:
        while True:
            now = time.monotonic() - start
            if now >= duration_s:
                break
            if window_t0 is None and now >= warmup_s:
                window_t0 = probe.begin()
            while arrivals and arrivals[0] <= now:
                engine.add_request(Request(rid, arrivals.popleft()))
                rid += 1
            if engine.has_work():
                engine._step()
            else:
                nxt = arrivals[0] if arrivals else duration_s
                time.sleep(max(0.0, min(nxt, duration_s, now + 0.05) - now))
            if progress and now - last_progress >= 0.25:
                last_progress = now
                progress(now, duration_s, engine)
    finally:
        if window_t0 is not None:
            probe.end("window", window_t0)
        if progress:
            progress(duration_s, duration_s, engine)
        if injector:
            injector.close()
        engine.executor.close()
        probe.close()
    del heap, leaky
    return {
        "steps": engine.steps,
        "requests": rid,
        "finished": engine.finished,
        "gc_stats": gc.get_stats(),
        "probe": probe.stats(),
    }


def build_parser():
    """The options of `python -m stallscope.demo.scenario` (what `stallscope demo` runs)."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("socket")
    p.add_argument("--duration", type=float, default=45.0)
    p.add_argument("--rate", type=float, default=1.0)
    p.add_argument("--gc-pressure", action="store_true")
    p.add_argument("--heap-objects", type=int, default=None)
    p.add_argument("--warmup", type=float, default=None)
    p.add_argument("--label", default="scenario")
    p.add_argument("--progress", action="store_true", help="print progress on stderr")
    p.add_argument("--inject", default="", help="comma list: block,submit,gc,preempt")
    p.add_argument("--inject-every", type=int, default=50)
    p.add_argument("--inject-ms", type=float, default=15.0)
    p.add_argument("--inject-log", default=None)
    p.add_argument(
        "--submit-jitter",
        default="0:0",
        metavar="P:MS",
        help="with probability P, a submit call does MS ms of extra host work "
        "(the seed saw ~1.7%% of steps ~3 ms slow inside submit: 0.017:3)",
    )
    p.add_argument("--census", action="store_true", help="heap census at connect and close")
    p.add_argument(
        "--gc-freeze-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="gc.collect() then gc.freeze() this long after connect (an A/B arm)",
    )
    p.add_argument("--result", default=None, help="write a JSON summary here")
    return p


def main(argv=None):
    """`python -m stallscope.demo.scenario SOCKET [options]`: run the engine alone."""
    p = build_parser()
    a = p.parse_args(argv)

    tty = sys.stderr.isatty()
    last = [-10.0]

    def progress(now, total, engine):
        if not tty and now < total and now - last[0] < 5.0:
            return  # not a terminal: a line every 5 s instead of a bar
        last[0] = now
        width = 30
        done = int(width * min(1.0, now / total))
        sys.stderr.write(
            f"{chr(13) if tty else ''}  engine [{'#' * done}{'.' * (width - done)}] "
            f"{now:5.1f}/{total:.0f} s  steps {engine.steps:6d}  "
            f"requests done {engine.finished:4d}"
        )
        if now >= total or not tty:
            sys.stderr.write("\n")
        sys.stderr.flush()

    try:
        p_str, ms_str = a.submit_jitter.split(":")
        jitter = (float(p_str), float(ms_str) / 1000.0)
    except ValueError:
        p.error(f"--submit-jitter wants P:MS such as 0.017:3, not {a.submit_jitter!r}")
    out = run_scenario(
        a.socket,
        a.duration,
        a.rate,
        a.gc_pressure,
        a.heap_objects,
        a.warmup,
        a.label,
        progress if a.progress else None,
        [c for c in a.inject.split(",") if c],
        a.inject_every,
        a.inject_ms,
        a.inject_log,
        submit_jitter=jitter,
        census=a.census,
        gc_freeze_after_s=a.gc_freeze_after,
    )
    if a.result:
        with open(a.result, "w") as f:
            json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
