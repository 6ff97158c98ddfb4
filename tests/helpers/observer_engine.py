"""A traced engine for the observer tests and benchmark: one step thread at
RATE steps/s, 4 spans a step (3 submits and the step), each step ~STEP_MS of
pure-Python work, optionally pinned to one CPU, optionally with a sibling
thread that keeps another CPU busy (hashing 1 MiB buffers, which releases the
GIL, so the sibling takes a CPU and not the step thread's GIL).

Usage: python observer_engine.py SOCKET SECONDS RATE STEP_MS PIN|- busy|idle
Prints one JSON line: steps, the step thread's tid and pid, and its
voluntary and involuntary context switches over the measured window (the
kernel's own counters, /proc/self/task/TID/status). Never asserts.
"""

import hashlib
import json
import os
import sys
import threading
import time

import probe_client


def work(n):
    s = 0
    for i in range(n):
        s += i
    return s


def iterations_for(ms):
    t = time.perf_counter()
    work(100_000)
    per = (time.perf_counter() - t) / 100_000
    return max(100, int(ms / 1000 / 3 / per))


def switches(tid):
    out = {}
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if "ctxt_switches" in line:
                key, value = line.split(":")
                out[key.strip()] = int(value)
    return out


def main(sock, seconds, rate, step_ms, pin, busy):
    if pin != "-":
        os.sched_setaffinity(0, {int(pin)})
    probe = probe_client.connect(socket_path=sock, run_label="observer")
    stop = threading.Event()

    def sibling():
        buf = b"x" * (1 << 20)
        while not stop.is_set():
            hashlib.sha256(buf).digest()

    if busy:
        threading.Thread(target=sibling, daemon=True).start()
    n = iterations_for(step_ms)
    tid = threading.get_native_id()
    time.sleep(1.0)  # connected, tracked, placed: the window starts here
    s0, t_start = switches(tid), time.monotonic_ns()
    period = 1.0 / rate
    t_next = time.monotonic()
    end = t_next + seconds
    steps = 0
    while time.monotonic() < end:
        t0 = probe.begin()
        for stage in ("prelude", "recurrent", "coda"):
            t1 = probe.begin()
            work(n)
            probe.end("submit", t1, stage=stage, batch=4)
        probe.end("step", t0, stage="recurrent", batch=4)
        steps += 1
        t_next += period
        delay = t_next - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    s1, t_end = switches(tid), time.monotonic_ns()
    stop.set()
    stats = dict(probe.stats(), pid=os.getpid())
    probe.close()
    print(
        json.dumps(
            {
                "steps": steps,
                "tid": tid,
                "pid": os.getpid(),
                "window_ns": [t_start, t_end],
                "nonvoluntary": s1["nonvoluntary_ctxt_switches"] - s0["nonvoluntary_ctxt_switches"],
                "voluntary": s1["voluntary_ctxt_switches"] - s0["voluntary_ctxt_switches"],
                "client": stats,
            }
        )
    )


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], float(a[1]), float(a[2]), float(a[3]), a[4], a[5] == "busy")
