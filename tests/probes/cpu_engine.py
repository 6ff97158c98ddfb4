"""The traced program of the CPU sampler's tests, run by any CPython 3.9+ with
the repository root on its path (PYTHONPATH): probe_client, nothing else.

    python cpu_engine.py SOCKET MODE SECONDS

Modes:
  chain    a thread spins in c() called from b() from a() (pure Python)
  zlib     a thread spins in zlib.compress (native leaf in libz)
  reuse    phase 1 spins in a function made by exec, which is then deleted;
           phase 2 in another whose code object, when the allocator allows,
           sits at the same address; phase 3 rewrites phase 2's
           co_firstlineno in place (same address, another checksum)
  steps    the main thread runs "step" spans (stage "decode"): every 10th
           also calls slow_part() (20x fast_part's work, so the slow steps
           hold two thirds of the CPU), the others only fast_part(); a fast
           step lasts ~0.5 ms, so the cost of the sample that lands in it
           cannot by itself lift it over 1.2x its baseline (at 0.1 ms, on
           a loaded VM, every sampled fast step was slow)
  idle     nothing but the probe (its flusher and report)

It connects, waits until its thread-state report went out, says
{"event": "ready", ...} on stdout, waits for a line on stdin (the test's
go), runs the mode's thread, says {"event": "spinner", "tid": ...} once
that thread is reported and {"event": "done"} at the end, then closes the
probe. Lines marked `# LINE_NAME` are looked up by the tests.
"""

import json
import os
import sys
import threading
import time

import probe_client


def say(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


def c(n):  # LINE_C_DEF
    x = 0
    for i in range(n):  # LINE_C_LOOP
        x += i * i  # LINE_C_BODY
    return x


def b(end):
    while time.monotonic() < end:
        c(20000)  # LINE_B_CALL


def a(end):
    b(end)  # LINE_A_CALL


def readspin(end):
    """Mostly in the kernel: 1 MiB reads of /dev/zero into a buffer already faulted in."""
    buf = bytearray(1 << 20)
    with open("/dev/zero", "rb", buffering=0) as f:
        while time.monotonic() < end:
            f.readinto(buf)


def zspin(end):
    import zlib

    data = os.urandom(1 << 16) * 8
    while time.monotonic() < end:
        zlib.compress(data, 9)  # LINE_Z_CALL


SRC = """
def {name}(end):
    x = 0
    while True:
        for i in range(20000):
            x += i
        if time.monotonic() > end:
            return x
"""


def make(name, pad):
    # pad shifts co_firstlineno; the code object's size stays the same
    ns = {"time": time}
    exec(compile("\n" * pad + SRC.format(name=name), f"<reuse-{name}>", "exec"), ns)
    return ns[name]


def reuse(seconds):
    import ctypes
    import gc

    from probe_client import pyoffsets

    per = seconds / 3.0
    f1 = make("first_fn", 0)
    addr1 = id(f1.__code__)
    say(event="phase", phase=1, name="first_fn", code=addr1, t=time.monotonic_ns())
    f1(time.monotonic() + per)
    del f1
    gc.collect()
    f2 = None
    for k in range(2000):
        cand = make("second_fn", 1 + (k % 50))
        if id(cand.__code__) == addr1:
            f2 = cand
            break
        del cand
    reused = f2 is not None
    if f2 is None:
        f2 = make("second_fn", 7)
    co = f2.__code__
    say(event="phase", phase=2, name="second_fn", code=id(co), reused=reused,
        firstlineno=co.co_firstlineno, t=time.monotonic_ns())  # fmt: skip
    f2(time.monotonic() + per)
    lay = pyoffsets.layout_for(sys.version_info)
    new_first = co.co_firstlineno + 1000
    ctypes.c_int.from_address(id(co) + lay["co_firstlineno"]).value = new_first
    say(event="phase", phase=3, name="second_fn", code=id(co), firstlineno=new_first,
        t=time.monotonic_ns())  # fmt: skip
    f2(time.monotonic() + per)
    say(event="phase", phase=4, t=time.monotonic_ns())


def fast_part():
    x = 0
    for i in range(20000):  # LINE_FAST
        x += i
    return x


def slow_part():
    x = 0
    for i in range(400000):  # LINE_SLOW
        x += i
    return x


def steps(probe, end):
    k = 0
    while time.monotonic() < end:
        t0 = probe.begin()
        fast_part()
        if k % 10 == 0:
            slow_part()
        probe.end("step", t0, stage="decode", batch=1)
        k += 1


def wait_reported(probe, before, timeout_s=5.0):
    """Until a thread-state listing newer than `before` went out."""
    deadline = time.monotonic() + timeout_s
    while probe.stats()["pythreads_sent"] <= before and time.monotonic() < deadline:
        time.sleep(0.01)


def main():
    sock, mode, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    probe = probe_client.connect(socket_path=sock, run_label=f"cpu-{mode}", gc=False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        st = probe.stats()
        if st["pythreads_sent"] or (st["pythreads_status"] or "").startswith("refused"):
            break
        time.sleep(0.01)
    time.sleep(0.05)
    st = probe.stats()
    say(event="ready", pid=os.getpid(), version=list(sys.version_info[:3]),
        status=st["pythreads_status"], t=time.monotonic_ns())  # fmt: skip
    sys.stdin.readline()
    end = time.monotonic() + seconds
    before = probe.stats()["pythreads_sent"]
    if mode == "steps":
        say(event="spinner", tid=threading.get_native_id(), t=time.monotonic_ns())
        steps(probe, end)
    else:
        target = {"chain": lambda: a(end), "zlib": lambda: zspin(end),
                  "reuse": lambda: reuse(seconds), "idle": lambda: time.sleep(seconds), "syscalls": lambda: readspin(end)}[mode]  # fmt: skip
        th = threading.Thread(target=target, name="spinner")
        th.start()
        if (probe.stats()["pythreads_status"] or "") == "ok":
            wait_reported(probe, before)
        say(event="spinner", tid=th.native_id, t=time.monotonic_ns())
        th.join()
    say(event="done", t=time.monotonic_ns(), stats=probe.stats())
    probe.close()


if __name__ == "__main__":
    main()
