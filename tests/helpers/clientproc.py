"""A probe client process for the fault suite: a paced engine loop.

Runs `steps` that each record a few spans (an outer `step`, inner `schedule`
and `forward` spans) at a target record rate for a duration, then idles a
moment (as an engine does at shutdown) and closes. Prints one JSON line: the
probe's stats, the step-time figures and its pid. Never asserts: the test
process judges. Usage: python clientproc.py SOCKET RATE DURATION_S LABEL
[--ready FILE] (touches FILE once connected and stepping).
"""

import fcntl
import json
import os
import struct
import sys
import termios
import time

import probe_client


def main(argv):
    socket_path, rate, duration_s, label = argv[0], float(argv[1]), float(argv[2]), argv[3]
    ready = argv[argv.index("--ready") + 1] if "--ready" in argv else None
    probe = probe_client.connect(socket_path=socket_path, run_label=label, gc=False)
    per_step = 3  # records a step makes
    t0 = time.monotonic()
    made = 0
    steps = 0
    step_ns = []
    if ready:
        open(ready, "w").close()
    mono = time.monotonic_ns
    while True:
        now = time.monotonic()
        if now - t0 >= duration_s:
            break
        due = int((now - t0) * rate) - made
        for _ in range(max(0, due) // per_step):
            s0 = mono()
            a = probe.begin()
            probe.end("schedule", a, stage="prelude", batch=4)
            b = probe.begin()
            probe.end("forward", b, stage="recurrent", batch=4)
            probe.end("step", s0, batch=4)
            step_ns.append(mono() - s0)
            made += per_step
            steps += 1
        time.sleep(0.001)
    # Idle, as an engine does at shutdown, until the daemon has read what we
    # sent (TIOCOUTQ: bytes still queued on our socket), so that the BYE that
    # reports any records dropped at the end gets through. Bounded: 30 s.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.05)
        sock = probe._sock
        if sock is None:
            break
        try:
            queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[
                0
            ]
        except OSError:
            break
        if queued == 0 and probe.stats()["next_seq"] == probe._seq:
            break
    probe.close()
    step_ns.sort()
    stats = probe.stats()
    stats.update(
        pid=os.getpid(),
        steps=steps,
        made=made,
        step_max_ns=step_ns[-1] if step_ns else 0,
        step_p99_ns=step_ns[int(len(step_ns) * 0.99)] if step_ns else 0,
        step_p50_ns=step_ns[len(step_ns) // 2] if step_ns else 0,
    )
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
