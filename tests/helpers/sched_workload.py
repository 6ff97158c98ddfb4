"""A child process whose one worker thread does scheduling on command.

Run by the sched probe tests as `python sched_workload.py`; the main thread
waits for "thread" on stdin and only then starts the worker (so the worker
is created after the probe started tracking), which then reads one command
per line from stdin and answers one line on stdout. It must never do
anything between commands: the tests bracket each command with /proc reads
taken while the worker sleeps in read().
"""

import ctypes
import json
import os
import sys
import threading
import time

# imported now, not at the first touch: an import's own page faults (with
# its work between them) must not share the burst's rows
import fault_kinds

PR_SET_NAME = 15


def set_comm(name):
    """Name the calling thread (its comm, as the kernel reports it)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode(), 0, 0, 0)


class Waker:
    """A sibling thread named stall-waker that writes to a pipe on request,
    ~1 ms after being asked: the worker blocks in read() until it does."""

    def __init__(self):
        self.r, self.w = os.pipe()
        self.asks = threading.Semaphore(0)
        self.tid = None
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait()

    def _run(self, ready):
        set_comm("stall-waker")
        self.tid = threading.get_native_id()
        ready.set()
        while True:
            self.asks.acquire()
            spin_for(0.001)
            os.write(self.w, b"x")

    def wake_me(self, n):
        for _ in range(n):
            self.asks.release()
            os.read(self.r, 1)


def touch_pages(kind, size, path=None, fill=False):
    """A fault burst of `kind` over `size` bytes (fault_kinds.py): its record,
    the kernel's fault count and the truth of its fault time included."""
    return fault_kinds.burst(kind, size, path, fill)


def spin_for(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def worker():
    inp = os.fdopen(0, "r", buffering=1)
    out = sys.stdout
    print(f"tid {threading.get_native_id()}", file=out, flush=True)
    waker = None
    for line in inp:
        cmd, *arg = line.split()
        if cmd == "pin":
            os.sched_setaffinity(0, {int(arg[0])})
            spin_for(0.001)
            reply = "done"
        elif cmd == "spin":
            # spin in 4 ms slices with a 0.5 ms sleep between: preempted by
            # whatever shares the CPU, and voluntary switches at each sleep.
            end = time.monotonic() + int(arg[0]) / 1000.0
            while time.monotonic() < end:
                spin_for(0.004)
                time.sleep(0.0005)
            reply = "done"
        elif cmd == "flip":
            cpu = os.sched_getaffinity(0).pop()
            for _ in range(int(arg[0])):
                cpu ^= 1
                os.sched_setaffinity(0, {cpu})
            reply = "done"
        elif cmd == "marks":
            marks = []
            cpu = os.sched_getaffinity(0).pop()
            for _ in range(int(arg[0])):
                t0 = time.monotonic_ns()
                time.sleep(0.0005)
                t1 = time.monotonic_ns()
                marks.append(("sleep", t0, t1))
                t0 = time.monotonic_ns()
                cpu ^= 1
                os.sched_setaffinity(0, {cpu})
                t1 = time.monotonic_ns()
                marks.append(("migrate", t0, t1))
            reply = json.dumps(marks)
        elif cmd == "wakeby":
            # blocked in read() n times, each time woken by the sibling
            waker = waker or Waker()
            waker.wake_me(int(arg[0]))
            reply = str(waker.tid)
        elif cmd in ("touch", "fill"):  # touch|fill KIND BYTES [FILE] (fill: whole pages)
            reply = json.dumps(touch_pages(arg[0], int(arg[1]), *arg[2:], fill=cmd == "fill"))
        elif cmd == "sparse":  # sparse PAGES SPIN_US: one fault, then user work, per page
            reply = json.dumps(fault_kinds.sparse(int(arg[0]), int(arg[1]) / 1e6, spin_for))
        elif cmd == "udp":
            # send n datagrams to a socket of our own on loopback: the
            # receive softirq runs on this CPU, in this thread's context
            import socket

            rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            rx.bind(("127.0.0.1", 0))
            tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            got = 0
            t0 = time.monotonic_ns()
            for _ in range(int(arg[0])):
                tx.sendto(b"x" * 512, rx.getsockname())
                got += 1
            t1 = time.monotonic_ns()
            rx.close()
            tx.close()
            reply = json.dumps([t0, t1, got])
        elif cmd == "syscalls":
            # n getppid() calls then one ~slow one (a 2 ms sleep via select)
            import select

            n = int(arg[0])
            t0 = time.monotonic_ns()
            for _ in range(n):
                os.getppid()
            t1 = time.monotonic_ns()
            select.select([], [], [], 0.002)
            t2 = time.monotonic_ns()
            reply = json.dumps([t0, t1, t2])
        elif cmd == "exit":
            print("bye", file=out, flush=True)
            return
        else:
            reply = "ok"
        print(reply, file=out, flush=True)


def main():
    sys.stdin.buffer.raw.read(len(b"thread\n"))
    t = threading.Thread(target=worker)
    t.start()
    t.join()


if __name__ == "__main__":
    main()
