"""What sleeping costs a process on this host: CPU to read memory again after a pause.

A daemon that sleeps between short bursts of work pays, on some hosts, for
each pause: on a VM, memory a thread touches again after it slept (its
heap, its libraries' code) is read at a fraction of the speed it was read
at a moment before, and the extra time is charged to the thread as CPU.
This reads one buffer of SIZE MiB (4 KiB pages, or transparent huge pages
where the kernel gives them) once warm, then again after sleeping each gap,
and prints the thread CPU time of each read (median of ROUNDS), the ratio
to the warm read and the extra time per 4 KiB page. It measures the host,
not stallscope: read the daemon's idle and busy footprint rows
(BENCHMARKS.md) beside it, since the same code reads 0.25 % of a core idle
on one VM and over 1 % on another. Needs no root; asserts nothing.

    .venv/bin/python bench/host_cold_memory.py [--size-mib 64] [--rounds 3]
"""

import argparse
import mmap
import statistics
import time

import numpy as np

GAPS_S = (0.0, 0.1, 0.5, 1.0, 3.0, 10.0)
PAGE = 4096


def buffer(size, huge):
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        m.madvise(mmap.MADV_HUGEPAGE)
    a = np.frombuffer(m, dtype=np.float64)
    a[:] = 1.0  # every page present before the first timed read
    return m, a


def huge_kib():
    """AnonHugePages of this process (kB): whether the huge arm got any."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def read_cpu_ms(a):
    c = time.thread_time_ns()
    a.sum()
    return (time.thread_time_ns() - c) / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.size_mib < 1 or args.rounds < 1:
        ap.error("--size-mib and --rounds must be at least 1")
    size = args.size_mib << 20
    pages = size // PAGE
    for huge in (False, True):
        m, a = buffer(size, huge)
        label = "huge pages (MADV_HUGEPAGE)" if huge else "4 KiB pages"
        print(f"{label}: {args.size_mib} MiB, AnonHugePages {huge_kib()} kB", flush=True)
        read_cpu_ms(a)
        warm = None
        for gap in GAPS_S:
            times = []
            for _ in range(args.rounds):
                read_cpu_ms(a)  # warm again, then the pause
                time.sleep(gap)
                times.append(read_cpu_ms(a))
            med = statistics.median(times)
            warm = med if warm is None else warm
            extra_ns = max(0.0, med - warm) * 1e6 / pages
            print(
                f"  after {gap:4.1f} s asleep: {med:7.2f} ms CPU (x{med / warm:.1f} the warm read; "
                f"+{extra_ns:.0f} ns a 4 KiB page; rounds "
                f"{', '.join(f'{t:.1f}' for t in times)})",
                flush=True,
            )
        del a
        m.close()


if __name__ == "__main__":
    main()
