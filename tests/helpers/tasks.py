"""Each thread of a process as /proc shows it: its name and one field of a
per-thread file (the observer tests' policies, the preemption bench's
switch counts). Threads that end while they are read are left out."""

import os


def task_field(pid, filename, prefix, parse=lambda v: v.strip()):
    """{tid: (comm, value)} for every thread of `pid`: value is `parse` of
    what follows ':' on the first line of /proc/PID/task/TID/FILENAME that
    starts with `prefix`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/{filename}") as f:
                value = next(ln.split(":", 1)[1] for ln in f if ln.startswith(prefix))
            out[int(tid)] = (comm, parse(value))
        except (OSError, StopIteration, ValueError):
            continue
    return out
