"""The CPU sampler's clock, chosen by what its timer costs here (`cpu_sample_clock = "auto"`).

The sampler's timer (a software cpu-clock perf event at `cpu_sample_hz`) is
an interrupt of its own in every sampled thread. On bare metal that is a few
microseconds; on this project's 2-vCPU Firecracker VM it is ~90 us of the
interrupted thread's CPU (the guest's timer exits to the host and the
thread comes back to cold caches): +10 % on every busy step of a torch
engine at 1 kHz (BENCHMARKS.md, "CPU sampler's clock alone"). The
scheduler's tick adds no interrupt but gives CONFIG_HZ samples (250 here).
With "auto", the default, the daemon measures the timer once at start: a
thread of its own, at idle priority (it never preempts an engine; under
load it is slower, and bounded by DEADLINE_S), repeats a fixed piece of
cache-touching work (a 4 MiB array summed and a dict walked: a Python
engine's mix) in windows of ~15 ms of its CPU time, with a per-thread
cpu-clock event at `cpu_sample_hz` switched on in every other window, and
compares the CPU time per piece with and without (the median over PAIRS
pairs of neighbouring windows). A timer that costs more than
MAX_TIMER_COST gives way to the tick; a measurement that cannot finish
(the event refused, the deadline passed) also takes the tick, the cheaper
clock, when the tick is usable. What was measured and chosen is in the
probe's status and the log.
"""

import os
import statistics
import threading
import time
from dataclasses import dataclass

from stallscope import threads
from stallscope.probes import perf_events

# Above this share of a busy thread's CPU the timer gives way to the tick.
# The sampler's budget is 0.5 % of the sampled thread's CPU (issue 25); the
# tick costs ~+0.9 % on a torch engine here and the timer +7-11 %, bare metal
# well under 1 %. At 2 % neither side is near the line: the measurement's
# own spread, a 1 Hz event in the same windows, read -0.7 to +1.7 % in 10
# measurements here (bench/clock_choice.py).
MAX_TIMER_COST = 0.02
PAIRS = 10
WINDOW_CPU_S = 0.015  # CPU time per window; longer at low rates (>= MIN_TICKS interrupts)
MIN_TICKS = 10
DEADLINE_S = 5.0  # wall time the measurement may take (idle priority on a busy host)
WORK_ARRAY_BYTES = 4 << 20
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401


@dataclass
class TimerCost:
    """One measurement: `cost` is the extra CPU time a busy thread spends
    with the timer on, as a share ((on - off) / off), or None and `why`."""

    hz: float
    cost: float = None
    pairs: int = 0
    seconds: float = 0.0
    why: str = None

    def describe(self):
        if self.cost is None:
            return f"the {self.hz:g} Hz timer's cost was not measured: {self.why}"
        return (
            f"a {self.hz:g} Hz timer cost a busy thread {self.cost * 100:+.1f} % of its CPU here "
            f"(median of {self.pairs} pairs, measured in {self.seconds:.2f} s)"
        )


def _work_piece():
    """One piece of work: memory-bound and interpreter-bound, like an engine."""
    import numpy as np

    array = np.random.default_rng(0).random(WORK_ARRAY_BYTES // 8)
    table = {i: i for i in range(20_000)}

    def piece():
        total = 0
        for i in range(0, 20_000, 7):
            total += table[i]
        return float(array.sum()) + total

    return piece


def _open_timer(hz):
    attr = perf_events.cpu_clock_attr(1e9 / hz)  # disabled until switched on
    return perf_events.perf_event_open(attr, 0, -1)  # this thread, any CPU


def _measure_here(hz, pairs, stop, result):
    """On the calling thread: the pairs of windows, into `result`."""
    try:
        fd = _open_timer(hz)
    except OSError as exc:
        result.why = f"cannot open a cpu-clock perf event: {exc.strerror}"
        return
    try:
        piece = _work_piece()
        window_ns = int(max(WINDOW_CPU_S, MIN_TICKS / hz) * 1e9)

        def window():
            start = time.thread_time_ns()
            end = start + window_ns
            n = 0
            now = start
            while now < end and not stop.is_set():
                piece()
                n += 1
                now = time.thread_time_ns()
            return (now - start) / max(n, 1)

        window()  # warm the caches and the allocator
        ratios = []
        for i in range(pairs):
            per_piece = {}
            for on in (True, False) if i % 2 else (False, True):
                if stop.is_set():
                    return  # measure() says why
                perf_events.ioctl(fd, PERF_EVENT_IOC_ENABLE if on else PERF_EVENT_IOC_DISABLE, 0)
                per_piece[on] = window()
            if stop.is_set():
                return
            perf_events.ioctl(fd, PERF_EVENT_IOC_DISABLE, 0)
            ratios.append(per_piece[True] / per_piece[False])
        result.cost = statistics.median(ratios) - 1.0
        result.pairs = len(ratios)
    except OSError as exc:
        result.why = f"the perf event could not be switched: {exc.strerror}"
    finally:
        os.close(fd)


def measure(hz, pairs=PAIRS, deadline_s=DEADLINE_S):
    """Measure the timer's cost at `hz` on a thread of its own at idle
    priority; waits at most `deadline_s`. Never raises."""
    result = TimerCost(hz=float(hz))
    stop = threading.Event()

    def run():
        threads.background("timer-cost")
        try:
            _measure_here(float(hz), pairs, stop, result)
        except Exception as exc:  # a measurement must never stop the daemon
            result.why = f"{type(exc).__name__}: {exc}"
        finally:
            threads.forget()

    t0 = time.monotonic()
    worker = threading.Thread(target=run, name="stallscope-timer-cost", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive():
        stop.set()
        worker.join()
        result.cost = None
        result.pairs = 0
        result.why = f"not done within {deadline_s:g} s, a busy host"
    result.seconds = time.monotonic() - t0
    return result


def choose(measured, tick_why):
    """("timer" or "tick", why) for "auto": `measured` a TimerCost (None
    when nothing was measured because the tick is unusable), `tick_why` None
    when the tick is usable, else why not."""
    if tick_why is not None:
        return "timer", f"auto chose the timer: the scheduler's tick is not usable: {tick_why}"
    if measured.cost is None:
        return "tick", f"auto chose the scheduler's tick: {measured.describe()}"
    allowed = f"{MAX_TIMER_COST * 100:g} % allowed"
    if measured.cost > MAX_TIMER_COST:
        return "tick", f"auto chose the scheduler's tick: {measured.describe()}, over the {allowed}"
    return "timer", f"auto chose the timer: {measured.describe()}, within the {allowed}"
