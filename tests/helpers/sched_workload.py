"""A child process whose one worker thread does scheduling on command.

Run by the sched probe tests as `python sched_workload.py`; the main thread
waits for "thread" on stdin and only then starts the worker (so the worker
is created after the probe started tracking), which then reads one command
per line from stdin and answers one line on stdout. It must never do
anything between commands: the tests bracket each command with /proc reads
taken while the worker sleeps in read().
"""

import json
import os
import sys
import threading
import time


def spin_for(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def worker():
    inp = os.fdopen(0, "r", buffering=1)
    out = sys.stdout
    print(f"tid {threading.get_native_id()}", file=out, flush=True)
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
