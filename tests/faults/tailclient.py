"""A well-behaved probe client that exits right after its last step.

Makes N step spans (an outer `step` with `schedule` and `forward` inside,
three records a step) spread over about DURATION_S, then closes at once, as
an engine that finishes does: no idle moment for the socket to drain, so
the last records and the BYE depend on close()'s bounded wait. Prints one
JSON line: the probe's stats and its pid. Usage:
python tailclient.py SOCKET STEPS DURATION_S [--wait-for FILE]
[--mark FRACTION FILE] (touch FILE once FRACTION of the steps are made)
[--closing FILE] (touch FILE right before close())
[--exit] (return without close(): the exit hook closes)
"""

import json
import os
import sys
import time

import probe_client


def main(argv):
    path, steps, duration_s = argv[0], int(argv[1]), float(argv[2])
    wait_for = argv[argv.index("--wait-for") + 1] if "--wait-for" in argv else None
    if wait_for:
        deadline = time.monotonic() + 30
        while not os.path.exists(wait_for) and time.monotonic() < deadline:
            time.sleep(0.005)
    mark_at, mark = (
        (float(argv[argv.index("--mark") + 1]), argv[argv.index("--mark") + 2])
        if "--mark" in argv
        else (2.0, None)
    )
    closing = argv[argv.index("--closing") + 1] if "--closing" in argv else None
    probe = probe_client.connect(socket_path=path, run_label="tail", gc=False)
    per_step_s = duration_s / max(steps, 1)
    t0 = time.monotonic()
    for i in range(steps):
        s0 = probe.begin()
        a = probe.begin()
        probe.end("schedule", a, stage="decode", batch=4)
        b = probe.begin()
        probe.end("forward", b)
        probe.end("step", s0, batch=4)
        if mark and i >= mark_at * steps:
            open(mark, "w").close()
            mark = None
        due = t0 + (i + 1) * per_step_s
        while time.monotonic() < due:
            pass  # busy, as an engine step is
    if "--exit" in argv:
        # No close(): the exit hook closes, with the same bounded wait. The
        # stats are final already (closing makes no record).
        stats = probe.stats()
        stats.update(pid=os.getpid())
        print(json.dumps(stats), flush=True)
        if closing:
            open(closing, "w").close()
        return
    if closing:
        open(closing, "w").close()
    probe.close()
    stats = probe.stats()
    stats.update(pid=os.getpid())
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
