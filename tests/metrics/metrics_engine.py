"""An engine loop for the metrics tests: steps in two stages and forced GC passes.

Connects a probe (GC callbacks on) with run label LABEL, then repeats: one
"step" span of stage prefill or decode (alternating, batch 4), and every
GC_EVERY steps a gen-2 collection of a few reference cycles it made. It runs
until STOP_FILE exists and it made at least MIN_STEPS steps, closes the probe
(which flushes) and prints one JSON line: its step counts by stage, the
collections it forced and the probe's stats. Never asserts: the test judges.
Usage: python metrics_engine.py SOCKET LABEL STOP_FILE [MIN_STEPS]
"""

import gc
import json
import os
import sys
import time

import probe_client

GC_EVERY = 25
HEAP_OBJECTS = 300_000


class Node:
    def __init__(self):
        self.other = None


def garbage(n):
    for _ in range(n):
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it


def main(argv):
    socket_path, label, stop_file = argv[0], argv[1], argv[2]
    min_steps = int(argv[3]) if len(argv) > 3 else 200
    heap = [[] for _ in range(HEAP_OBJECTS)]  # what a gen-2 pass must traverse
    probe = probe_client.connect(socket_path=socket_path, run_label=label, gc=True)
    steps = {"prefill": 0, "decode": 0}
    forced = 0
    n = 0
    while n < min_steps or not os.path.exists(stop_file):
        stage = "prefill" if n % 2 == 0 else "decode"
        t0 = probe.begin()
        time.sleep(0.002)
        n += 1
        if n % GC_EVERY == 0:
            garbage(50)
            gc.collect(2)
            forced += 1
        probe.end("step", t0, stage=stage, batch=4)
        steps[stage] += 1
    probe.close()
    del heap
    print(json.dumps({"steps": steps, "forced_gen2": forced, "stats": probe.stats()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
