"""A traced engine for the summary tests: a step thread and a pool worker.

Usage: python summary_client.py SOCKET SECONDS. Connects a probe client,
waits for a line on stdin (the test's word that the daemon follows it); the
main thread runs `step` spans (a little pure-Python work and a 1 ms sleep
each) for SECONDS; a worker thread that never emits a span sleeps 200 us at
a time meanwhile (thousands of switches a second, like a torch OpenMP
worker). Each thread reads its own switch counts (/proc .../status) and
on-CPU time (schedstat) at the start and the end of the steps, while
running, and the totals are printed as JSON. Never asserts: the test judges.
"""

import json
import os
import sys
import threading
import time

import probe_client


def counts():
    tid = threading.get_native_id()
    with open(f"/proc/self/task/{tid}/status") as f:
        text = f.read()
    vol = int(text.split("\nvoluntary_ctxt_switches:")[1].split()[0])
    inv = int(text.split("nonvoluntary_ctxt_switches:")[1].split()[0])
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        oncpu_ns = int(f.read().split()[0])
    return {"ns": time.monotonic_ns(), "vol": vol, "inv": inv, "oncpu_ns": oncpu_ns}


def main(socket_path, seconds):
    probe = probe_client.connect(socket_path=socket_path, run_label="summary", gc=False)
    print("connected", flush=True)
    sys.stdin.readline()  # the daemon follows this process now
    stop = threading.Event()
    out = {"pid": os.getpid(), "step_tid": threading.get_native_id()}

    def worker():
        out["worker_tid"] = threading.get_native_id()
        out["worker_start"] = counts()
        while not stop.is_set():
            time.sleep(0.0002)
        out["worker_end"] = counts()

    thread = threading.Thread(target=worker, name="pool-worker")
    thread.start()
    out["step_start"] = counts()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = probe.begin()
        sum(range(2000))
        time.sleep(0.001)
        probe.end("step", t0, batch=1)
    out["step_end"] = counts()
    stop.set()
    thread.join()
    probe.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
