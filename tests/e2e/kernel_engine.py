"""A traced engine whose steps are made slow, on purpose, by kernel causes.

Usage: python kernel_engine.py SOCKET LOG STEPS EVERY. Pinned to CPU 1, it
runs STEPS steps of ~3 ms of pure-Python work, each a `step` span; every
EVERY-th step also carries one injection, in turn:

  syscalls  20,000 getppid() calls inside the step
  faults    first touch of 2,048 fresh 4 KiB pages inside the step
  gil       a sibling thread named stall-gil (on CPU 0) runs pure Python
            while the step thread does too for 30 ms (switch interval 1 ms):
            the step waits for the GIL, woken partly by that sibling
  preempt   a SCHED_FIFO process named stall-fifo, pinned to CPU 1, spins
            15 ms while the step runs

Each injection is logged as one JSON line (cause, step start/end, the step
thread's tid, and who: the sibling's tid or the FIFO process's pid). Never
asserts: the test judges.
"""

import ctypes
import json
import mmap
import os
import subprocess
import sys
import threading
import time

import probe_client

PR_SET_NAME = 15
CAUSES = ("syscalls", "faults", "gil", "preempt")
FIFO = """
import ctypes, os, sys, time
ctypes.CDLL(None).prctl(15, b"stall-fifo", 0, 0, 0)
os.sched_setaffinity(0, {1})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
print("ready", flush=True)
for line in sys.stdin:
    end = time.monotonic() + 0.015
    while time.monotonic() < end:
        pass
"""


def work(seconds):
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1
    return x


class GilHog:
    """Runs pure Python from go.set() until stop.set(), then sets done: the
    whole hold stays inside the step that asked for it."""

    def __init__(self):
        self.go = threading.Event()
        self.stop = threading.Event()
        self.done = threading.Event()
        self.tid = None
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait()

    def _run(self, ready):
        ctypes.CDLL(None).prctl(PR_SET_NAME, b"stall-gil", 0, 0, 0)
        # another core, as an API-server or tokenizer thread would be: the
        # step thread then waits for the GIL alone, not for the CPU too
        os.sched_setaffinity(0, {0})
        self.tid = threading.get_native_id()
        ready.set()
        while True:
            self.go.wait()
            self.go.clear()
            while not self.stop.is_set():
                work(0.001)
            self.stop.clear()
            self.done.set()


def touch(pages):
    m = mmap.mmap(-1, pages * 4096)
    m.madvise(mmap.MADV_NOHUGEPAGE)
    buf = (ctypes.c_char * (pages * 4096)).from_buffer(m)
    ctypes.memset(buf, 1, pages * 4096)
    del buf
    m.close()


def main(socket_path, log_path, steps, every):
    os.sched_setaffinity(0, {1})
    sys.setswitchinterval(0.001)
    fifo = subprocess.Popen(
        [sys.executable, "-c", FIFO], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert fifo.stdout.readline().strip() == "ready"
    hog = GilHog()
    probe = probe_client.connect(socket_path=socket_path, run_label="kernel-e2e", gc=False)
    tid = threading.get_native_id()
    log = open(log_path, "w")
    n_injected = 0
    for i in range(steps):
        cause = None
        if i > 20 and i % every == 0:
            cause = CAUSES[n_injected % len(CAUSES)]
            n_injected += 1
        who = None
        t0 = probe.begin()
        if cause == "syscalls":
            for _ in range(20_000):
                os.getppid()
        elif cause == "faults":
            touch(2048)
        elif cause == "gil":
            hog.done.clear()
            hog.go.set()
            work(0.030)
            hog.stop.set()
            hog.done.wait()
            who = hog.tid
        elif cause == "preempt":
            fifo.stdin.write("go\n")
            fifo.stdin.flush()
            work(0.030)
            who = fifo.pid
        work(0.003)
        probe.end("step", t0, batch=1)
        t1 = time.monotonic_ns()
        if cause:
            log.write(json.dumps({"cause": cause, "start_ns": t0, "end_ns": t1, "tid": tid,
                                  "who": who}) + "\n")  # fmt: skip
        time.sleep(0.001)
    log.close()
    probe.close()
    fifo.stdin.close()
    fifo.wait()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
