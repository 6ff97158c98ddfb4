"""Shared by the CPU sampler's daemon tests: the traced engine and reading its stacks.

`Engine` runs tests/probes/cpu_engine.py under an interpreter (optionally
behind a command prefix such as capsh) and speaks its JSON lines;
`stacks` / `chain_share` read what the daemon stored for one thread.
"""

import collections
import json
import os
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENGINE = os.path.join(ROOT, "tests", "probes", "cpu_engine.py")
CHAIN_S = 2.0


def marker_lines(path=ENGINE):
    out = {}
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if "# LINE_" in line:
                out[line.split("# LINE_")[1].split()[0]] = i
    return out


LINES = marker_lines()


class Engine:
    """One run of cpu_engine.py under `python`, speaking JSON lines."""

    def __init__(self, python, sock, mode, seconds, env=None, prefix=None):
        env = {**os.environ, "PYTHONPATH": ROOT, "STALLSCOPE_PYTHREADS_INTERVAL_MS": "200",
               **(env or {})}  # fmt: skip
        cmd = [python, ENGINE, sock, mode, str(seconds)]
        if prefix is not None:
            cmd = prefix(cmd)
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.events = []

    def expect(self, event, timeout_s=60):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"engine exited before {event}: {self.proc.poll()}")
            ev = json.loads(line)
            self.events.append(ev)
            if ev["event"] == event:
                return ev
        raise TimeoutError(event)

    def run(self):
        ready = self.expect("ready")
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        spinner = self.expect("spinner")
        done = self.expect("done")
        self.proc.wait(30)
        return {"ready": ready, "spinner": spinner, "done": done, "events": self.events}


def stacks(daemon, pid, tid):
    """[(count, [(kind, file, function, line), ...] leaf first)] of one thread."""
    rows = daemon.query(
        "SELECT s.stack_id, count(*) FROM cpu_samples s WHERE s.pid = ? AND s.tid = ? GROUP BY ALL",
        [pid, tid],
    )
    frames = daemon.query(
        "SELECT st.stack_id, st.depth, f.kind, f.file, f.function, f.line FROM cpu_stacks st "
        "JOIN cpu_frames f USING (frame_id) WHERE st.stack_id IN "
        "(SELECT DISTINCT stack_id FROM cpu_samples WHERE pid = ? AND tid = ?) "
        "ORDER BY st.stack_id, st.depth",
        [pid, tid],
    )
    by_stack = collections.defaultdict(list)
    for sid, _, kind, file, function, line in frames:
        by_stack[sid].append((kind, file, function, line))
    return [(n, by_stack.get(sid, [])) for sid, n in rows]


def python_frames(stack):
    return [f for f in stack if f[0] == "py"]


CHAIN_WANT = (
    ("c", {LINES["C_LOOP"], LINES["C_BODY"]}),
    ("b", {LINES["B_CALL"]}),
    ("a", {LINES["A_CALL"]}),
)


def chain_share(daemon, run):
    """(good, total, lead_s) for the spinner thread's samples: `good` have the
    whole a -> b -> c chain with its files and lines. Samples taken before the
    daemon had applied the process's thread-state report (its first report
    travels through the client's flusher and the daemon's ingest: up to a
    second or two on a loaded host) carry no Python frame at all: they are
    left out of both counts, and `lead_s` says how long that lasted, so a
    report that never arrives still fails."""
    pid, tid = run["ready"]["pid"], run["spinner"]["tid"]
    frames = daemon.query(
        "SELECT st.stack_id, st.depth, f.kind, f.file, f.function, f.line FROM cpu_stacks st "
        "JOIN cpu_frames f USING (frame_id) WHERE st.stack_id IN "
        "(SELECT DISTINCT stack_id FROM cpu_samples WHERE pid = ? AND tid = ?) "
        "ORDER BY st.stack_id, st.depth",
        [pid, tid],
    )
    stack_of = collections.defaultdict(list)
    for sid, _, kind, file, function, line in frames:
        stack_of[sid].append((kind, file, function, line))
    samples = daemon.query(
        "SELECT ts_ns, stack_id FROM cpu_samples WHERE pid = ? AND tid = ? ORDER BY ts_ns",
        [pid, tid],
    )
    first_py = next(
        (i for i, (_, sid) in enumerate(samples) if python_frames(stack_of.get(sid, []))), None
    )
    if first_py is None:
        return 0, len(samples), float("inf")
    lead_s = (samples[first_py][0] - samples[0][0]) / 1e9
    total = good = 0
    for _, sid in samples[first_py:]:
        total += 1
        py = python_frames(stack_of.get(sid, []))[:3]
        if len(py) == 3 and all(
            f[1] == ENGINE and f[2] == name and f[3] in lines
            for f, (name, lines) in zip(py, CHAIN_WANT, strict=True)
        ):
            good += 1
    return good, total, lead_s


def sampler_daemon(tmp_path, *args):
    """A started daemon with the CPU sampler on and no scheduling probe,
    `args` appended (its rate, its clock); root and bcc required (a skip, a
    failure under STALLSCOPE_REQUIRE_PRIVILEGED=1)."""
    from helpers.daemonproc import DaemonProcess
    from helpers.privileged import is_root, require_privileged
    from stallscope.probes.cpu_bcc import BccCpuProbe

    require_privileged(
        is_root() and BccCpuProbe.unavailable() is None,
        f"requires root and bcc: {BccCpuProbe.unavailable()}",
    )
    daemon = DaemonProcess(tmp_path, sched_backend="none", extra_args=["--cpu-sampler", *args])
    daemon.start(timeout_s=90)
    return daemon
