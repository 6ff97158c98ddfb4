"""A serving engine shaped like the seed's, for the demo and end-to-end tests.

`Engine._step()` calls `Engine._schedule()`, then `executor.submit(batch)`,
whose ticket's `collect()` waits for the result (real numpy work standing in
for the GPU, run synchronously on the engine thread as in the seed's
single-stream eager configuration). Requests arrive from a fixed,
seeded trace and run FCFS, up to 96 in flight, through the stages of a
recurrent-depth model: prefill, then for every output token prelude, N
recurrent loops (8 for the first token, 4 after) and coda. Stage costs are
calibrated at start so that prelude/recurrent/coda steps take ~4-7 ms here.

The engine knows nothing of stallscope: `run_scenario` instruments it with
`probe.attach()` from outside, as a user would. `--gc-pressure` adds the
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
from collections import deque

import numpy as np

STAGES = ("prefill", "prelude", "recurrent", "coda")
PROMPT_TOKENS = 64
OUTPUT_TOKENS = 64
FIRST_TOKEN_LOOPS = 8
LATER_TOKEN_LOOPS = 4
MAX_IN_FLIGHT = 96

# Target host time per stage, milliseconds: (base, per request in the batch).
STAGE_COST_MS = {
    "prefill": (30.0, 4.0),
    "prelude": (4.0, 0.15),
    "recurrent": (5.0, 0.2),
    "coda": (4.5, 0.15),
}


class Request:
    __slots__ = ("rid", "arrival_s", "phase", "loops_left", "tokens_out", "done")

    def __init__(self, rid, arrival_s):
        self.rid = rid
        self.arrival_s = arrival_s
        self.phase = "prefill"
        self.loops_left = 0
        self.tokens_out = 0
        self.done = False

    def advance(self):
        """Move to the next stage after a step of the current one."""
        if self.phase == "prefill":
            self.phase = "prelude"
        elif self.phase == "prelude":
            self.phase = "recurrent"
            self.loops_left = FIRST_TOKEN_LOOPS if self.tokens_out == 0 else LATER_TOKEN_LOOPS
        elif self.phase == "recurrent":
            self.loops_left -= 1
            if self.loops_left <= 0:
                self.phase = "coda"
        else:  # coda emits a token
            self.tokens_out += 1
            if self.tokens_out >= OUTPUT_TOKENS:
                self.done = True
            else:
                self.phase = "prelude"


class Batch:
    """What `_schedule()` returns: the stage and the requests of one step."""

    __slots__ = ("phase", "requests")

    def __init__(self, phase, requests):
        self.phase = phase
        self.requests = requests


class StageWork:
    """Numpy matrix products sized so each stage costs its target time."""

    def __init__(self, dim=192, seed=0):
        rng = np.random.default_rng(seed)
        self.a = rng.standard_normal((dim, dim)).astype(np.float32)
        self.b = rng.standard_normal((dim, dim)).astype(np.float32)
        self.out = np.empty_like(self.a)
        # The fastest of several timings: other load on the machine only ever
        # slows a timing down, and would otherwise make every step too short.
        samples = []
        for _ in range(30):
            t0 = time.perf_counter()
            for _ in range(10):
                np.dot(self.a, self.b, out=self.out)
            samples.append((time.perf_counter() - t0) / 10)
        self.dot_s = min(samples)

    def reps(self, phase, batch):
        base, per = STAGE_COST_MS[phase]
        return max(1, int(round((base + per * batch) / 1000.0 / self.dot_s)))

    def run(self, reps):
        for _ in range(reps):
            np.dot(self.a, self.b, out=self.out)
        return float(self.out[0, 0])


class Ticket:
    """A submission; `collect()` runs the stage's work and returns its result.

    Execution is synchronous on the engine thread (the seed's configuration:
    single stream, eager), so the engine thread is on CPU for the whole step
    unless something takes it off: exactly what the attribution must see."""

    __slots__ = ("_work", "_reps", "result", "__dict__", "__weakref__")

    def __init__(self, work, reps):
        self._work = work
        self._reps = reps
        self.result = None

    def collect(self):
        if self._work is not None:
            self.result = self._work.run(self._reps)
            self._work = None
        return self.result


class Executor:
    """Turns a batch into a ticket; the host-side part of a GPU submission."""

    def __init__(self, work, jitter_p=0.0, jitter_s=0.0, seed=0):
        self.work = work
        self.submit_extra_s = 0.0  # injected host-side delay inside submit()
        # The seed's second effect: ~1.7% of steps ~3 ms slow inside submit.
        self.jitter_p = jitter_p
        self.jitter_s = jitter_s
        self._rng = random.Random(seed)

    def submit(self, batch):
        if self.jitter_p and self._rng.random() < self.jitter_p:
            _burn_cpu(self.jitter_s)
        if self.submit_extra_s:
            _burn_cpu(self.submit_extra_s)
            self.submit_extra_s = 0.0
        return Ticket(self.work, self.work.reps(batch.phase, len(batch.requests)))

    def close(self):
        pass


class Engine:
    """FCFS scheduler over in-flight requests; one stage per step."""

    def __init__(self, work, submit_jitter=(0.0, 0.0)):
        self.executor = Executor(work, *submit_jitter)
        self.waiting = deque()
        self.running = []
        self.finished = 0
        self.steps = 0

    def add_request(self, request):
        self.waiting.append(request)

    def has_work(self):
        return bool(self.waiting or self.running)

    def _schedule(self):
        while self.waiting and len(self.running) < MAX_IN_FLIGHT:
            self.running.append(self.waiting.popleft())
        new = [r for r in self.running if r.phase == "prefill"]
        if new:
            return Batch("prefill", new)
        phase = self.running[0].phase  # the oldest request's stage, FCFS
        return Batch(phase, [r for r in self.running if r.phase == phase])

    def _step(self):
        batch = self._schedule()
        result = self.executor.submit(batch).collect()
        for request in batch.requests:
            request.advance()
        if any(r.done for r in batch.requests):
            self.finished += sum(1 for r in batch.requests if r.done)
            self.running = [r for r in self.running if not r.done]
        self.steps += 1
        return result


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


def _burn_cpu(seconds):
    """Host work: `seconds` of this thread's CPU time, however long it takes
    on a busy machine (time preempted is not work done)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class Injector:
    """Makes chosen steps slow for a known reason and writes down which.

    Every `every`-th step gets the next cause in `causes`, inside the step:
    'block' (a sleep), 'submit' (host work inside executor.submit), 'gc' (a
    full collection), 'preempt' (a SCHED_FIFO process pinned to the engine's
    CPU wakes and spins, so the engine thread is preempted, not blocked).
    Each injected step is logged as JSON: cause, start_ns, end_ns, tid."""

    def __init__(self, engine, causes, every, extra_ms, log_path):
        self.engine = engine
        self.causes = list(causes)
        self.every = every
        self.extra_s = extra_ms / 1000.0
        self.log = open(log_path, "w") if log_path else None
        self.i = 0
        self._orig_step = engine._step
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
            return self._orig_step()
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
        result = self._orig_step()
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
    probe = probe_client.connect(socket_path=socket_path, run_label=label)
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
    )
    if a.result:
        with open(a.result, "w") as f:
            json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
