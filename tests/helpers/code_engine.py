"""The traced engine of the `code` cause's end-to-end test, run by any CPython
3.9+ with the repository root on its path (PYTHONPATH): probe_client,
nothing else.

    python code_engine.py SOCKET STEPS INJECT_MS LOG

Every step ("decode", batch 1) spends ~8 ms in base_work() and ~2 ms in
every_step() on CPU. Every 9th to 11th step (seeded) one kind of extra
on-CPU work of about INJECT_MS is added, in turn: rare_path(), a Python
function called nowhere else; zlib.compress, a C function (its leaf is in
libz); every_step() with a larger input. Each injection is logged to LOG as
a JSON line with the step's start (the span's start_ns), end and kind. The
loop counts are calibrated on this CPU first, so the sizes hold on a slower
or faster machine.

zlib.compress allocates ~270 KB of state a call: with glibc's default
thresholds that memory is mapped and unmapped (or trimmed) every call, and
an injected step took ~4,400 page faults, ~21 ms of its ~37 ms excess on
this VM: as much as its code, so `page_fault` won a quarter of them (one CI
run). Freed memory stays in the heap here (keep_freed_memory), so the
injection is code, as the test means it.
"""

import ctypes
import json
import os
import random
import sys
import time
import zlib

import probe_client


def base_work(n):
    x = 0
    for i in range(n):
        x += i * i
    return x


def every_step(n):
    x = 0
    for i in range(n):
        x ^= i * 3
    return x


def rare_path(n):
    x = 0
    for i in range(n):
        x += i % 7
    return x


DATA = os.urandom(1 << 14) * 4  # 64 KiB: 16 KiB of random bytes, 4 times


def compress(k):
    for _ in range(k):
        zlib.compress(DATA, 6)


def keep_freed_memory():
    """glibc: no mmap for blocks under 64 MB, no trim under 64 MB free."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc: the faults stay
        pass


def per_ms(fn, arg):
    """Units of `arg` per ms of fn on this CPU (the fastest of a few runs)."""
    best = None
    for _ in range(5):
        t0 = time.perf_counter()
        fn(arg)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return arg / (best * 1000)


def main():
    sock, steps, inject_ms, log_path = (
        sys.argv[1],
        int(sys.argv[2]),
        float(sys.argv[3]),
        sys.argv[4],
    )
    keep_freed_memory()
    base_n = round(per_ms(base_work, 200_000) * 8)
    every_n = round(per_ms(every_step, 50_000) * 2)
    rare_n = round(per_ms(rare_path, 200_000) * inject_ms)
    big_n = every_n + round(per_ms(every_step, 200_000) * inject_ms)
    zlib_k = max(1, round(per_ms(compress, 20) * inject_ms))
    kinds = {
        "python": lambda: rare_path(rare_n),
        "zlib": lambda: compress(zlib_k),
        "bigger": None,  # every_step(big_n) in place of every_step(every_n)
    }
    order = list(kinds)
    rng = random.Random(26)
    probe = probe_client.connect(socket_path=sock, run_label="code-e2e")
    time.sleep(0.5)  # the thread-state report reaches the daemon before the steps
    log = open(log_path, "w")
    nxt, turn = 20, 0
    for k in range(steps):
        kind = None
        if k == nxt:
            kind = order[turn % len(order)]
            turn += 1
            nxt += rng.randint(9, 11)
        t0 = probe.begin()
        base_work(base_n)
        every_step(big_n if kind == "bigger" else every_n)
        if kind in ("python", "zlib"):
            kinds[kind]()
        t1 = time.monotonic_ns()
        probe.end("step", t0, stage="decode", batch=1)
        if kind:
            log.write(json.dumps({"kind": kind, "start_ns": t0, "end_ns": t1, "step": k}) + "\n")
    log.close()
    probe.close()


if __name__ == "__main__":
    main()
