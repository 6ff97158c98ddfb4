"""A traced engine whose slow steps have one kernel cause each, and nothing else.

Usage: python cause_engine.py SOCKET LOG STEPS EVERY. Pinned to CPU 1, each
step does the same fixed amount of pure-Python work (~3 ms; a count of
iterations, not a time, so anything that stops the thread makes the step
longer by exactly that much). Every EVERY-th step also carries one
injection, in turn:

  syscalls  200 reads of 1 MiB from /dev/zero (the kernel fills the buffer:
            time inside system calls, on CPU)
  faults    first touch of 4,096 fresh 4 KiB pages
  gil       a sibling thread named stall-gil (on CPU 0) runs pure Python
            for 15 ms from the step's start: the step waits for the GIL
            (the GIL may pass through another thread of the process, e.g.
            the probe's, which then is the one that wakes the step)
  preempt   a SCHED_FIFO process named stall-fifo, pinned to CPU 1, spins
            15 ms while the step runs

Each injection is logged as one JSON line (cause, step start/end, tid, and
who: the sibling's tid or the FIFO process's pid). Never asserts.
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


def spin(n):
    x = 0
    for _ in range(n):
        x += 1
    return x


def calibrate(ms):
    """Iterations of spin() that take about `ms` here."""
    n = 100_000
    t0 = time.perf_counter()
    spin(n)
    return max(1, int(n * ms / 1000 / (time.perf_counter() - t0)))


class GilHog:
    def __init__(self):
        self.go = threading.Event()
        self.started = threading.Event()
        self.done = threading.Event()
        self.tid = None
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait()

    def _run(self, ready):
        ctypes.CDLL(None).prctl(15, b"stall-gil", 0, 0, 0)
        os.sched_setaffinity(0, {0})
        self.tid = threading.get_native_id()
        ready.set()
        while True:
            self.go.wait()
            self.go.clear()
            self.started.set()
            end = time.perf_counter() + 0.015
            while time.perf_counter() < end:
                spin(1000)
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
    fifo = subprocess.Popen(
        [sys.executable, "-c", FIFO], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert fifo.stdout.readline().strip() == "ready"
    hog = GilHog()
    zero = os.open("/dev/zero", os.O_RDONLY)
    buf = bytearray(1 << 20)
    n = calibrate(3)
    probe = probe_client.connect(socket_path=socket_path, run_label="cause-e2e", gc=False)
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
            for _ in range(200):
                os.readv(zero, [buf])
        elif cause == "faults":
            touch(4096)
        elif cause == "gil":
            hog.done.clear()
            hog.started.clear()
            hog.go.set()
            hog.started.wait()  # the sibling holds the GIL from here
            who = hog.tid
        elif cause == "preempt":
            fifo.stdin.write("go\n")
            fifo.stdin.flush()
            who = fifo.pid
        spin(n)
        probe.end("step", t0, batch=1)
        t1 = time.monotonic_ns()
        if cause == "gil":
            hog.done.wait()
        if cause:
            log.write(json.dumps({"cause": cause, "start_ns": t0, "end_ns": t1, "tid": tid,
                                  "who": who}) + "\n")  # fmt: skip
        time.sleep(0.002)
    log.close()
    probe.close()
    fifo.stdin.close()
    fifo.wait()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
