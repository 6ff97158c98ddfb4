"""A CUDA-driving engine for the tests, on the fake driver (tests/cuda/fake_libcuda.c).

`python cuda_engine.py serve LIB` prints {"pid", "tid"} and then runs one
command per stdin line, answering each with a JSON line ([t0, t1]: the
monotonic ns around it): `load` (dlopen LIB now), `launch N [NAME]`,
`sync NS spin|sleep [NAME]` (the GPU busy for NS, then a sync), `poll NS
[NAME]` (busy for NS, then queries until done), `copy N [NAME]`,
`pointer NAME N` (N launches through the pointer cuGetProcAddress gave),
`cost N NAME` ([wall, thread CPU] ns of N calls), `steps N L` (each step's
wall ns, L launches and a sync per step), `quit`.

`python cuda_engine.py steps SOCKET LIB PLAN` runs the plan (a JSON file)
as steps traced by the probe client: each step launches `launches` kernels,
keeps the GPU busy `gpu_ns` and syncs (`sync`: 'spin', 'sleep' or 'poll');
the steps listed in `inject` ({index: {"gpu_ns": ..., "sync": ...} or
{"launches": N, "launch_ns": ns}}) do more, under SCHED_FIFO when the
entry says "fifo". It waits for `start_file`, if
the plan names one, before its first step and prints {"pid", "tid",
"starts": [step start ns, ...]} when done. Never asserts: the test judges.
"""

import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from helpers.fakecuda import FakeCuda


def serve(lib_path):
    cuda = None
    print(json.dumps({"pid": os.getpid(), "tid": threading.get_native_id()}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        t0 = time.monotonic_ns()
        cmd, args = words[0], words[1:]
        if cmd == "load":
            cuda = FakeCuda(lib_path)
        elif cmd == "launch":
            cuda.launch(int(args[0]), *args[1:2])
        elif cmd == "sync":
            cuda.busy_for(int(args[0]))
            cuda.sync(*(args[2:3] or ["cuStreamSynchronize"]), sleeps=args[1] == "sleep")
        elif cmd == "poll":
            cuda.busy_for(int(args[0]))
            cuda.poll(*args[1:2])
        elif cmd == "copy":
            for _ in range(int(args[0])):
                cuda.copy(*args[1:2])
        elif cmd == "cost":  # N calls of NAME: [wall ns, this thread's CPU ns]
            fn, n = getattr(cuda.lib, args[1]), int(args[0])
            args11 = (None, 1, 1, 1, 1, 1, 1, 0, None, None, None)
            c0, w0 = time.thread_time_ns(), time.monotonic_ns()
            if args[1].startswith("cuLaunchKernel"):
                for _ in range(n):
                    fn(*args11)
            else:
                for _ in range(n):
                    fn(None)
            print(json.dumps([time.monotonic_ns() - w0, time.thread_time_ns() - c0]), flush=True)
            continue
        elif cmd == "steps":  # N steps of L launches and a sync: [step wall ns, ...]
            n, per = int(args[0]), int(args[1])
            walls = []
            for _ in range(n):
                w0 = time.monotonic_ns()
                cuda.launch(per)
                cuda.sync()
                walls.append(time.monotonic_ns() - w0)
            print(json.dumps(walls), flush=True)
            continue
        elif cmd == "pointer":
            import ctypes as ct

            addr = cuda.proc_address(args[0])
            proto = ct.CFUNCTYPE(ct.c_int, ct.c_void_p, *[ct.c_uint] * 7, *[ct.c_void_p] * 3)
            fn = proto(addr)
            for _ in range(int(args[1])):
                fn(None, 1, 1, 1, 1, 1, 1, 0, None, None, None)
        print(json.dumps([t0, time.monotonic_ns()]), flush=True)


def realtime(on):
    """SCHED_FIFO 1 for one injected step, so that a busy shared machine
    cannot preempt the injection (a competing cause the test would have to
    leave out); never fails the engine."""
    try:
        if on:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        else:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        pass


def steps(socket_path, lib_path, plan_path):
    import probe_client

    with open(plan_path) as f:
        plan = json.load(f)
    # at nice -10, as tests/helpers/cause_engine.py runs: the test runs under
    # nice 15 on a shared machine and the engine must not inherit that
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        pass
    cuda = FakeCuda(lib_path)
    probe = probe_client.connect(socket_path=socket_path, run_label="cuda", gc=False)
    start_file = plan.get("start_file")
    while start_file and not os.path.exists(start_file):
        time.sleep(0.01)
    inject = {int(k): v for k, v in plan.get("inject", {}).items()}
    starts, syncs, launched = [], [], []
    for i in range(plan["steps"]):
        extra = inject.get(i, {})
        if extra.get("fifo"):
            realtime(True)
        t0 = probe.begin()
        starts.append(t0)
        cuda.lib.fake_set_launch_ns(int(extra.get("launch_ns", plan.get("launch_ns", 0))))
        l0 = time.monotonic_ns()
        cuda.launch(int(extra.get("launches", plan["launches"])))
        launched.append(
            time.monotonic_ns() - l0
        )  # the launch calls' wall time, as the engine saw it
        cuda.busy_for(int(extra.get("gpu_ns", plan["gpu_ns"])))
        how = extra.get("sync", plan["sync"])
        if how == "poll":
            cuda.poll()
        else:
            cuda.sync(sleeps=how == "sleep")
        # when the "GPU" was done and when its sync came back (CLOCK_MONOTONIC)
        syncs.append((cuda.lib.fake_busy_until(), time.monotonic_ns()))
        probe.end("step", t0, batch=1)
        if extra.get("fifo"):
            realtime(False)
        time.sleep(plan.get("gap_s", 0.002))
    probe.close()
    out = {"pid": os.getpid(), "tid": threading.get_native_id(), "starts": starts,
           "syncs": syncs, "launched": launched}  # fmt: skip
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        steps(*sys.argv[2:5])
