"""A small traced engine for the export tests: steps, submits and GC passes.

Usage: python fleet_engine.py SOCKET LABEL STEPS GC_EVERY SLEEP_EVERY. Each
step does a fixed count of pure-Python iterations (~1 ms) inside a `step`
span (stage decode, batch 4 or 8) with a `submit` span inside; every
GC_EVERY-th step also runs a full collection over a heap of cycles (a gen-2
pass inside the step) and every SLEEP_EVERY-th step sleeps 5 ms (a slow step
no probe of the test explains). 0 disables either. Never asserts.
"""

import gc
import sys
import time

import probe_client


class Engine:
    def __init__(self, probe, gc_every, sleep_every):
        self.probe = probe
        self.n = 0
        self.gc_every = gc_every
        self.sleep_every = sleep_every
        self.heap = []

    def submit(self):
        t0 = self.probe.begin()
        out = sum(range(2000))
        self.probe.end("submit", t0)
        return out

    def step(self, batch):
        t0 = self.probe.begin()
        self.n += 1
        total = 0
        for i in range(20000):
            total += i
        self.submit()
        if self.gc_every and self.n % self.gc_every == 0:
            # garbage cycles, then a full pass that collects them
            self.heap = [[] for _ in range(20000)]
            for a in self.heap:
                a.append(a)
            self.heap = []
            gc.collect(2)
        if self.sleep_every and self.n % self.sleep_every == 0:
            time.sleep(0.005)
        self.probe.end("step", t0, stage="decode", batch=batch)
        return total


def main(argv):
    socket, label, steps, gc_every, sleep_every = argv[1], argv[2], *map(int, argv[3:6])
    gc.disable()  # only the engine's own full passes, at known steps
    probe = probe_client.connect(socket_path=socket, run_label=label)
    engine = Engine(probe, gc_every, sleep_every)
    for i in range(steps):
        engine.step(4 if i % 3 else 8)
    probe.close()


if __name__ == "__main__":
    main(sys.argv)
