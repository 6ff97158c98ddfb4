"""Heap census cost against the size of the GC-tracked heap.

Builds a heap of N tracked objects (lists of one int, as a loaded model's
Python heap is mostly containers; N + 1 tracked objects, one size at a
time), then times `probe_client._census.
take_census` (a start census, then a close census against it, which also
parses the start's full histogram) in interleaved rounds over the sizes,
so that machine noise hits every size alike. The census holds the GIL for
most of its run: this is the stall it costs every thread, twice per run
(connect and close). Prints per size the median start and close census in
ms and ns per tracked object. Usage: python bench/census_cost.py [--sizes
100000,1000000] [--rounds 7]
"""

import argparse
import gc
import statistics
import time

from probe_client import _census


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100000,1000000")
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    gc.collect()
    base = len(gc.get_objects())
    times = {n: ([], []) for n in sizes}
    for _ in range(a.rounds):
        for n in sizes:
            heap = [[i] for i in range(n)]  # built per round: one size visible at a time
            gc.collect()
            t0 = time.perf_counter_ns()
            _, histogram = _census.take_census("start")
            t1 = time.perf_counter_ns()
            _census.take_census("close", baseline=histogram)
            t2 = time.perf_counter_ns()
            del heap, histogram
            times[n][0].append(t1 - t0)
            times[n][1].append(t2 - t1)
    print(f"tracked objects besides the heap: ~{base:,}")
    print(f"{'heap objects':>14} {'start ms':>9} {'close ms':>9} {'ns/object':>10}")
    for n in sizes:
        start = statistics.median(times[n][0])
        close = statistics.median(times[n][1])
        print(f"{n:>14,} {start / 1e6:>9.1f} {close / 1e6:>9.1f} {start / n:>10.1f}")


if __name__ == "__main__":
    main()
