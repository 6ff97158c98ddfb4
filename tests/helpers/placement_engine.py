"""An engine for the placement check: the same work twice, alone or with a
cache-thrashing hog on its CPU between its steps.

usage: placement_engine.py SOCKET LABEL STEPS CPU HOG(0|1)

Pinned to CPU, at nice -10, each step walks a dict of 200,000 entries (~20
MB of objects: its speed depends on what the caches still hold) and sleeps 3
ms. With HOG=1 a child process pinned to the same CPU at nice 19 writes over
64 MB, one byte a cache line, whenever the engine sleeps (at nice 19 it gets
next to none of the CPU while a step runs), so each step starts cache-cold.
Prints its pid.
"""

import os
import signal
import sys
import time

import probe_client


def hog():
    os.nice(19)
    buf = bytearray(64 << 20)
    while True:
        for i in range(0, len(buf), 64):
            buf[i] = (buf[i] + 1) & 0xFF


def walk(table):
    total = 0
    for k, v in table.items():
        total += v if k & 1 else -v
    return total


def main(socket_path, label, steps, cpu, with_hog):
    os.sched_setaffinity(0, {int(cpu)})
    try:
        os.nice(-10)
    except OSError:
        pass
    table = {i * 7919: i for i in range(200_000)}
    child = None
    if with_hog == "1":
        child = os.fork()
        if child == 0:
            hog()
    probe = probe_client.connect(socket_path=socket_path, run_label=label, gc=False)
    try:
        for _ in range(int(steps)):
            t0 = probe.begin()
            walk(table)
            probe.end("step", t0, stage="decode", batch=1)
            time.sleep(0.003)
    finally:
        probe.close()
        if child:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
    print(os.getpid(), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:6])
