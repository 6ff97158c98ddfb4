"""Page-fault bursts of three kinds, each with its truth measured in the faulting thread.

  anon   4 KiB anonymous first touches (MAP_PRIVATE, MADV_NOHUGEPAGE): one
         fault per page, the kernel zeroes a page
  huge   2 MiB-aligned anonymous regions with MADV_HUGEPAGE: one fault per
         region, the kernel zeroes 2 MiB (THP is `madvise` on our hosts; if
         no huge page can be had the kernel falls back to 4 KiB faults, which
         `faults` shows)
  file   a page-cached file mapped privately and written: one copy-on-write
         fault per 4 KiB page, the kernel copies the cached page. (Reading
         a cached file instead faults once per 64 KiB to 2 MiB here, fault-
         around over ext4's large folios, ~8 us per MiB: too cheap to slow a
         step; docs/kernel-causes.md gives its error too.)

Each burst touches one byte per 4 KiB page (strided, in C through a
memoryview), then touches the same bytes again once mapped. The truth of
its fault time is the thread's CPU time (CLOCK_THREAD_CPUTIME_ID) of the
first touch minus that of the second: the time the faults added, whatever
else the machine did meanwhile (preemption is not the thread's CPU time).
`first()` runs inside a step and `settle()` after it, so the second touch
and the unmapping stay out of the step. Stdlib only; imported by path by
scripts in this folder (cause_engine.py, sched_workload.py).
"""

import mmap
import os
import resource
import time

KINDS = ("anon", "huge", "file")
PAGE = 4096
HUGE = 2 << 20


def cached_file(path, size):
    """A file of `size` bytes at `path`, read once so that it is in the page
    cache (rewritten if its size differs)."""
    if not os.path.exists(path) or os.path.getsize(path) != size:
        with open(path, "wb") as f:
            for _ in range(size // (1 << 20)):
                f.write(os.urandom(1 << 20))
            f.write(os.urandom(size % (1 << 20)))
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass
    return path


class Burst:
    """One burst of `kind` over `size` bytes (a multiple of 2 MiB for huge);
    `file` needs `path`, a cached file of at least `size` bytes."""

    def __init__(self, kind, size, path=None, fill=False):
        self.kind = kind
        self.size = size
        self.fill = fill  # write every byte of each page (memset), not one byte per page
        self._fd = None
        if kind == "file":
            self._fd = os.open(path, os.O_RDONLY)
            self.map = mmap.mmap(self._fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
            self.map.madvise(mmap.MADV_NOHUGEPAGE)
            self._base = memoryview(self.map)
            self.view = self._base
        else:
            extra = HUGE if kind == "huge" else 0
            self.map = mmap.mmap(-1, size + extra, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            off = 0
            if kind == "huge":
                # the region must be 2 MiB-aligned to get huge pages: the
                # mapping's address, from a throwaway ctypes view
                import ctypes

                base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
                off = (-base) % HUGE
                self.map.madvise(mmap.MADV_HUGEPAGE, off, size)
            else:
                self.map.madvise(mmap.MADV_NOHUGEPAGE)
            self._base = memoryview(self.map)
            self.view = self._base[off : off + size]
        self._ones = b"\x01" * ((size + PAGE - 1) // PAGE)
        self.t0 = self.t1 = None
        self.first_cpu_ns = self.again_cpu_ns = None
        self.faults = self.preempted = None

    def _touch(self):
        if self.fill:
            import ctypes

            buf = (ctypes.c_char * self.size).from_buffer(self.view)
            c0 = time.thread_time_ns()
            ctypes.memset(buf, 1, self.size)
            took = time.thread_time_ns() - c0
            del buf
            return took
        c0 = time.thread_time_ns()
        self.view[::PAGE] = self._ones
        return time.thread_time_ns() - c0

    def first(self):
        """The first touch: every page faults. Returns self."""
        r0 = resource.getrusage(resource.RUSAGE_THREAD)
        self.t0 = time.monotonic_ns()
        self.first_cpu_ns = self._touch()
        self.t1 = time.monotonic_ns()
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
        self.faults = r1.ru_minflt - r0.ru_minflt
        self.preempted = r1.ru_nivcsw - r0.ru_nivcsw
        return self

    def settle(self):
        """Touch the same bytes again (no fault), then unmap; returns the
        record: kind, t0/t1 (CLOCK_MONOTONIC ns of the first touch), faults
        (the kernel's minor-fault count of it), preempted (its involuntary
        switches) and truth_ns."""
        self.again_cpu_ns = self._touch()
        self.view.release()
        self._base.release()
        self.map.close()
        if self._fd is not None:
            os.close(self._fd)
        return {
            "kind": self.kind,
            "t0": self.t0,
            "t1": self.t1,
            "faults": self.faults,
            "preempted": self.preempted,
            "first_cpu_ns": self.first_cpu_ns,
            "again_cpu_ns": self.again_cpu_ns,
            "truth_ns": self.first_cpu_ns - self.again_cpu_ns,
        }


def burst(kind, size, path=None, fill=False):
    """First touch then settle, at once: the record of Burst.settle()."""
    return Burst(kind, size, path, fill).first().settle()


def sparse(pages, spin_s, spin_for):
    """`pages` 4 KiB first touches, each followed by `spin_s` of user-mode
    work (`spin_for`, no fault, no system call): faults far apart, whose
    time is ~2-5 us each and must not take the work after them. Returns
    t0/t1 (CLOCK_MONOTONIC ns), faults (the kernel's count of the thread)
    and spin_ns (the work's CPU time, the faults' time included)."""
    m = mmap.mmap(-1, pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_NOHUGEPAGE)
    view = memoryview(m)
    r0 = resource.getrusage(resource.RUSAGE_THREAD)
    t0 = time.monotonic_ns()
    c0 = time.thread_time_ns()
    for i in range(pages):
        view[i * PAGE] = 1
        spin_for(spin_s)
    c1 = time.thread_time_ns()
    t1 = time.monotonic_ns()
    r1 = resource.getrusage(resource.RUSAGE_THREAD)
    view.release()
    m.close()
    return {"t0": t0, "t1": t1, "faults": r1.ru_minflt - r0.ru_minflt, "spin_ns": c1 - c0}
