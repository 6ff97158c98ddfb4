"""A traced engine that stops making progress in one of three ways (the hang tests).

`python hang_engine.py SOCKET MODE`: a step thread ("engine-step") runs
busy steps of ~5 ms (batch 1) for STEPS_S, prints {"event": "hanging",
"ns": monotonic ns} and starts one more step that never ends:
- lock: the step waits in `wait_for_lock` on a lock that the thread
  "holder" took before blocking in `holder_reads_pipe` on a pipe nobody writes;
- spin: the step spins in `spin_forever` (a Python loop counting in
  `COUNTER`, its time and count kept every 4,096 counts);
- ccall: the step is inside `long_c_call`, a regular expression whose
  backtracking runs in C for hours, holding the GIL;
- pause: the step sleeps PAUSE_S (in `pause_then_resume`), then the engine
  runs busy steps again, an idle one, prints {"event": "resumed"} and waits
  (a hang that recovers);
- idle: busy steps, then idle steps (batch 0) for 0.5 s, then it waits in
  a queue for work that never comes: never hung ({"event": "waiting"}).
The main thread waits for a line on stdin, then prints the counter (and,
if the line is a monotonic ns, the spinner's series from then on) and exits.
Threads carry kernel names (prctl) so the dump can name them.
"""

import ctypes
import json
import os
import queue
import re
import sys
import threading
import time

import probe_client

STEPS_S = 1.5
PAUSE_S = 3.0
COUNTER = [0]
SERIES = ([0] * (1 << 18), [0] * (1 << 18))  # spin: (monotonic ns, count) every 4,096 counts
LOCK = threading.Lock()


def _name(text):
    try:
        ctypes.CDLL(None).prctl(15, text.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except Exception:
        pass


def holder_reads_pipe(r, ready):
    _name("holder")
    with LOCK:
        ready.set()
        os.read(r, 1)


def wait_for_lock():
    LOCK.acquire()


def spin_forever():
    # Every 4,096 counts the time and the count go into SERIES (a ring
    # allocated up front), so that the counter's rate in any window of time
    # can be read afterwards (a capture of the process must not slow it).
    n, times, counts, mono = COUNTER, SERIES[0], SERIES[1], time.monotonic_ns
    size, at = len(times), 0
    while True:
        n[0] += 1
        if not n[0] & 4095:
            times[at % size] = mono()
            counts[at % size] = n[0]
            at += 1


def long_c_call():
    return re.match(r"(a+)+b", "a" * 64)


def work():
    t = time.monotonic() + 0.005
    while time.monotonic() < t:
        pass


def step_thread(probe, mode):
    _name("engine-step")
    end = time.monotonic() + STEPS_S
    while time.monotonic() < end:
        t0 = probe.begin()
        work()
        probe.end("step", t0, batch=1)
    if mode == "idle":
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            t0 = probe.begin()
            time.sleep(0.05)  # the queue's wait for a request, timed out
            probe.end("step", t0, batch=0)
        print(json.dumps({"event": "waiting"}), flush=True)
        queue.Queue().get()  # no request ever comes
    time.sleep(0.3)  # the last step ends reach the daemon, the thread list is sent
    print(json.dumps({"event": "hanging", "ns": time.monotonic_ns(),
                      "tid": threading.get_native_id()}), flush=True)  # fmt: skip
    t0 = probe.begin()
    if mode == "pause":
        pause_then_resume(probe, t0)
        return
    {"lock": wait_for_lock, "spin": spin_forever, "ccall": long_c_call}[mode]()


def pause_then_resume(probe, t0):
    time.sleep(PAUSE_S)
    probe.end("step", t0, batch=1)
    for _ in range(20):
        t0 = probe.begin()
        work()
        probe.end("step", t0, batch=1)
    t0 = probe.begin()
    probe.end("step", t0, batch=0)
    print(json.dumps({"event": "resumed", "ns": time.monotonic_ns()}), flush=True)
    queue.Queue().get()


def main():
    sock, mode = sys.argv[1], sys.argv[2]
    probe = probe_client.connect(sock, run_label=f"hang-{mode}")
    if mode == "lock":
        r, _w = os.pipe()
        ready = threading.Event()
        threading.Thread(target=holder_reads_pipe, args=(r, ready), daemon=True).start()
        ready.wait()
    t = threading.Thread(target=step_thread, args=(probe, mode), daemon=True)
    t.start()
    print(json.dumps({"event": "ready", "pid": os.getpid()}), flush=True)
    line = sys.stdin.readline().strip()
    print(json.dumps({"event": "counter", "value": COUNTER[0]}), flush=True)
    if line.isdigit():  # the spinner's series from that monotonic ns on
        kept = sorted((t, c) for t, c in zip(*SERIES, strict=True) if t >= int(line))
        print(json.dumps({"event": "series", "t": [t for t, _ in kept],
                          "n": [c for _, c in kept]}), flush=True)  # fmt: skip
    os._exit(0)


if __name__ == "__main__":
    main()
