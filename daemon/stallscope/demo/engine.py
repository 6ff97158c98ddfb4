"""The serving engine the demo traces, shaped like the seed's, and its toy twin.

`Engine._step()` calls `Engine._schedule()`, then `executor.submit(batch)`,
whose ticket's `collect()` waits for the result (real numpy work standing in
for the GPU, run synchronously on the engine thread as in the seed's
single-stream eager configuration). Requests run FCFS, up to 96 in flight,
through the stages of a recurrent-depth model: prefill, then for every
output token prelude, N recurrent loops (8 for the first token, 4 after)
and coda. Stage costs are calibrated at start so that prelude/recurrent/coda
steps take ~4-7 ms here. `ToyEngine` has the same methods and classes with
no work and one fixed batch, so that only instrumentation costs time
(bench/probe_overhead.py, the probe's GC-rule tests). The engine knows
nothing of stallscope: `scenario.py` instruments it from outside, as a user
would.
"""

import random
import time
from collections import deque

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
        # numpy here, not at import: the toy engine (the probe client's tests,
        # on interpreters without numpy) needs none
        import numpy as np

        self._dot = np.dot
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
                self._dot(self.a, self.b, out=self.out)
            samples.append((time.perf_counter() - t0) / 10)
        self.dot_s = min(samples)

    def reps(self, phase, batch):
        base, per = STAGE_COST_MS[phase]
        return max(1, int(round((base + per * batch) / 1000.0 / self.dot_s)))

    def run(self, reps):
        for _ in range(reps):
            self._dot(self.a, self.b, out=self.out)
        return float(self.out[0, 0])


class NoWork:
    """Stands in for StageWork where only the engine's shape matters: no
    work, and a ticket's result is its batch size."""

    def reps(self, phase, batch):
        return batch

    def run(self, reps):
        return reps


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

    ticket_class = Ticket  # a subclass may hand out its own kind of ticket

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
        return self.ticket_class(self.work, self.work.reps(batch.phase, len(batch.requests)))

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


def _burn_cpu(seconds):
    """Host work: `seconds` of this thread's CPU time, however long it takes
    on a busy machine (time preempted is not work done). The work is Python
    arithmetic and the clock is read every 2,000 additions (~50 us here):
    each `thread_time()` is a system call, and a loop of nothing but those
    spent 59 % of its time in the kernel, which is not the user-mode host
    work it stands for (the CPU sampler's kernel-mode samples are never
    `code`)."""
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for i in range(2000):
            x += i
    return x


class ToyEngine:
    """The engine's shape without work: `_step` -> `_schedule` ->
    `executor.submit` -> `ticket.collect`, always the same small batch."""

    def __init__(self, executor=None):
        self.executor = executor if executor is not None else Executor(NoWork())
        self.requests = (1, 2, 3)

    def _schedule(self):
        return Batch("recurrent", self.requests)

    def _step(self):
        return self.executor.submit(self._schedule()).collect()
