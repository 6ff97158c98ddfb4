"""The hang watchdog in a real daemon (CPU sampler on real BPF) on three real hangs.

One daemon traces tests/hang/hang_engine.py three times, each engine with
its own 1 s threshold (STALLSCOPE_RUN_HANG_THRESHOLD_MS, the per-run
override): (a) the step thread waits on a lock held by a thread blocked
reading a pipe nobody writes, while another traced process of its run group
(STALLSCOPE_GROUP) waits on a queue: the dump has that process's threads
too; (b) the step thread spins in a Python loop;
(c) the step thread is inside a C call (a regular expression's
backtracking) holding the GIL. While each is hung, `/proc/PID/status`
says `TracerPid: 0` at every look and the engine's threads keep their
state (the spinner's counter advances while the dump is taken, and it
never pauses for as long as a capture while `stallscope stacks` reads
it, where a SIGSTOP of 2 ms shows as a pause of 2 ms); then one
engine that pauses in a step for 3 s and resumes is hung, then recovered,
and one engine that reports idle steps and waits is never hung. The
API's live stream (StreamEvents, kind HUNG) tells each episode's start
and its end. The daemon is stopped and the database read: one dump per episode, detected within
threshold + 2 s of the hang, naming the function each thread is in (an
engine starved for over 1 s in its busy phase on a loaded machine has an
episode of its own before, which must have recovered).
Off-CPU frames (a) come from /proc/PID/mem (the daemon runs as root here).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from helpers.daemonproc import DaemonProcess
from helpers.privileged import is_root, require_privileged
from helpers.prometheus import metrics_port, samples, scrape
from helpers.waiting import wait_for
from stallscope.probes import hang_proc
from stallscope.probes.cpu_bcc import BccCpuProbe

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENGINE = os.path.join(ROOT, "tests", "hang", "hang_engine.py")
THRESHOLD_MS = 1000


class HangEngine:
    def __init__(self, sock, mode, env=None):
        env = {**os.environ, "PYTHONPATH": ROOT, "STALLSCOPE_PYTHREADS_INTERVAL_MS": "200",
               "STALLSCOPE_RUN_HANG_THRESHOLD_MS": str(THRESHOLD_MS), **(env or {})}  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, ENGINE, sock, mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def expect(self, event):
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"engine exited before {event}: {self.proc.poll()}")
            ev = json.loads(line)
            if ev["event"] == event:
                return ev

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


class HungStream:
    """HUNG events of the daemon's live stream, collected on a thread."""

    def __init__(self, api_socket):
        from stallscope.api.client import Client
        from stallscope.api.v1 import stallscope_pb2 as pb

        self.client = Client(api_socket)
        self.client.wait_ready()
        self.call = self.client.events(kinds=[pb.HUNG])
        self.events = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        import grpc

        try:
            for batch in self.call:
                self.events.extend(
                    e.hung for e in batch.events if e.WhichOneof("payload") == "hung"
                )
        except grpc.RpcError:
            pass  # cancelled at stop, or the daemon stopped

    def stop(self):
        self.call.cancel()
        self.thread.join(10)
        self.client.close()


def _hung_in_log(daemon, pid=None):
    """Episodes the daemon logged (of `pid`)."""
    return daemon.read_log().count(f"(pid {pid}) hung: " if pid else " hung: ")


def _tracer_pids(pid, seconds):
    """TracerPid at 20 looks over `seconds` (all must be 0)."""
    out = []
    for _ in range(20):
        out.append(hang_proc.tracer_pid(pid))
        time.sleep(seconds / 20)
    return out


SERIES_BEFORE_NS = 300_000_000  # the spinner's series kept from 0.3 s before the first capture
STOP_MS = 2  # the control: the spinner stopped (SIGSTOP) this long


def _bracketed_captures(sock, pid, n=5):
    """`stallscope stacks PID`'s request made here n times, 0.5 s apart:
    [(sent ns, answered ns, the capture's own ns)]. The request is the
    command's own function, so that the bracket is the capture and the
    socket's round trip, not a process start."""
    from stallscope.cli.profile import ask_stacks

    out = []
    for _ in range(n):
        time.sleep(0.5)
        t0 = time.monotonic_ns()
        answer = ask_stacks(sock, pid)
        out.append((t0, time.monotonic_ns(), answer["capture_ns"]))
    return out


def _stopped_bracket(pid, tid):
    """The control for the captures' brackets: the spinner's thread kept
    stopped (SIGSTOP) for STOP_MS, as a capture that stopped the process
    would stop it. [(from ns, to ns, the stop's own ns)], from the moment
    /proc shows the thread stopped to just before SIGCONT. A SIGSTOP takes
    effect only once a thread of the process runs to take it: on a loaded
    machine that can be ms later, and a SIGCONT before then cancels it (CI
    once read a 0.14 ms pause in a 2.1 ms SIGSTOP-to-SIGCONT bracket)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        assert wait_for(
            lambda: hang_proc.kernel_state("/proc", pid, tid)["state"] == "T",
            timeout_s=10,
            interval_s=0.0005,
        )
        t0 = time.monotonic_ns()
        time.sleep(STOP_MS / 1000)
        t1 = time.monotonic_ns()
    finally:
        os.kill(pid, signal.SIGCONT)
    return [(t0, t1, t1 - t0)]


def _longest_pause(series, a, b):
    """The longest time between monotonic ns a and b in which the spinner's
    counter did not advance by 4,096 (the points its series keeps): about
    0.15 ms while it runs, at least the stop while it is stopped."""
    import numpy as np

    t = np.asarray(series["t"], dtype=np.int64)
    inside = t[(t > a) & (t < b)]
    return int(np.diff(np.concatenate(([a], inside, [b]))).max())


# Another process of the lock engine's run group (STALLSCOPE_GROUP): a
# traced process whose thread "peer-waits" waits on a queue in `peer_waits`.
PEER = """
import ctypes, json, os, queue, sys, threading
import probe_client
probe = probe_client.connect(socket_path=sys.argv[1], run_label="hang-peer", gc=False)
def peer_waits(q):
    ctypes.CDLL(None).prctl(15, b"peer-waits", 0, 0, 0)
    q.get()
t = threading.Thread(target=peer_waits, args=(queue.Queue(),), daemon=True)
t.start()
probe.end("step", probe.begin(), batch=0)
print(json.dumps({"pid": os.getpid(), "tid": t.native_id}), flush=True)
threading.Event().wait()
"""


def _lock_and_others(daemon, port, runs):
    """The three hangs in turn, each watched until its dump was logged."""
    for mode in ("lock", "spin", "ccall"):
        # the lock engine shares a run group with the peer: its dump has the peer's threads too
        env = {"STALLSCOPE_GROUP": "hang-lock"} if mode == "lock" else None
        eng = HangEngine(daemon.socket, mode, env=env)
        try:
            ready = eng.expect("ready")
            pid = ready["pid"]
            hanging = eng.expect("hanging")
            # An episode before "hanging" is one the engine's own busy
            # phase had (starved for over the 1 s threshold on a loaded
            # machine): it recovered; the hang is the next one.
            before = _hung_in_log(daemon, pid)
            assert wait_for(lambda p=pid, b=before: _hung_in_log(daemon, p) > b, timeout_s=30), (
                daemon.read_log()[-3000:]
            )
            tracers = _tracer_pids(pid, 1.0)
            threads_now = hang_proc.read_threads(pid)[0]
            episodes = _hung_in_log(daemon)
            metrics = samples(scrape(port))
            runs[mode] = {
                "pid": ready["pid"],
                "hanging": hanging,
                "tracers": tracers,
                "states": {t["tid"]: t["state"] for t in threads_now},
                "metrics": metrics,
                "episodes": episodes,
            }
            if mode == "spin":
                brackets = _bracketed_captures(daemon.socket, pid)
                runs[mode]["stopped"] = _stopped_bracket(pid, hanging["tid"])
                eng.proc.stdin.write(f"{brackets[0][0] - SERIES_BEFORE_NS}\n")
                eng.proc.stdin.flush()
                runs[mode]["brackets"] = brackets
                runs[mode]["series"] = eng.expect("series")
        finally:
            eng.kill()


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    require_privileged(
        is_root() and BccCpuProbe.unavailable() is None,
        f"requires root and bcc: {BccCpuProbe.unavailable()}",
    )
    tmp = tmp_path_factory.mktemp("hang")
    args = ["--cpu-sampler", "--hang-min-dump-interval-s", "0", "--metrics-listen", "127.0.0.1:0",
            "--api-socket", str(tmp / "api.sock")]  # fmt: skip
    daemon = DaemonProcess(tmp, extra_args=args)
    daemon.start(timeout_s=90)
    port = metrics_port(daemon)
    runs = {}
    stream = HungStream(str(tmp / "api.sock"))
    try:
        peer = subprocess.Popen(
            [sys.executable, "-c", PEER, daemon.socket],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": ROOT, "STALLSCOPE_GROUP": "hang-lock"},
        )
        try:
            runs["peer"] = json.loads(peer.stdout.readline())
            _lock_and_others(daemon, port, runs)
        finally:
            peer.kill()
            peer.wait(10)
        pause = HangEngine(daemon.socket, "pause")
        try:
            pid = pause.expect("ready")["pid"]
            runs["pause"] = {"pid": pid, "hanging": pause.expect("hanging")}
            ended = daemon.read_log().count("recovered after")
            runs["pause"]["resumed"] = pause.expect("resumed")
            assert wait_for(
                lambda: daemon.read_log().count("recovered after") > ended, timeout_s=30
            ), daemon.read_log()[-3000:]
        finally:
            pause.kill()
        idle = HangEngine(daemon.socket, "idle")
        try:
            runs["idle"] = {"pid": idle.expect("ready")["pid"]}
            idle.expect("waiting")
            time.sleep(3 * THRESHOLD_MS / 1000)
        finally:
            idle.kill()
    finally:
        stream.stop()
        daemon.stop()
    log = daemon.read_log()
    runs["hung_events"] = stream.events
    return daemon, runs, log


def _dump(daemon, run):
    """The one dump of the episode that began with the engine's hang."""
    rows = daemon.query(
        "SELECT dump_id, detected_ns, threshold_ns, threads, lacks, reason, recovered_ns "
        "FROM hang_dumps WHERE pid = ? ORDER BY detected_ns",
        [run["pid"]],
    )
    hung = [r for r in rows if r[1] > run["hanging"]["ns"]]
    assert len(hung) == 1, rows  # one dump per episode
    earlier = [r for r in rows if r not in hung]
    assert all(r[6] is not None and r[6] < run["hanging"]["ns"] for r in earlier), rows
    return hung[0][:6]


def _threads(daemon, dump_id, own=True):
    """{thread_name: (state, source, [functions innermost first])} of the
    hung process's threads (own), or of its run group's other processes'."""
    out = {}
    for name, state, source, function in daemon.query(
        "SELECT thread_name, state, source, function FROM hang_dump_stacks "
        "WHERE dump_id = ? AND (thread_pid = pid) = ? ORDER BY tid, depth",
        [dump_id, own],
    ):
        got = out.setdefault(name, (state, source, []))
        got[2].append(function)
    return out


@pytest.mark.parametrize("mode", ["lock", "spin", "ccall"])
def test_detected_within_threshold_plus_2s_never_traced(traced, mode):
    daemon, runs, _ = traced
    run = runs[mode]
    dump_id, detected_ns, threshold_ns, threads, lacks, reason = _dump(daemon, run)
    assert threshold_ns == THRESHOLD_MS * 1_000_000, reason
    assert "per-run threshold" in reason
    # the hang began at the engine's last step start, just after "hanging"
    assert detected_ns - run["hanging"]["ns"] <= threshold_ns + 2_000_000_000
    assert threads >= 2 and lacks is None
    assert run["tracers"] == [0] * 20


def test_lock_names_the_waiter_and_the_pipe_reader(traced):
    daemon, runs, _ = traced
    dump_id = _dump(daemon, runs["lock"])[0]
    got = _threads(daemon, dump_id)
    state, source, functions = got["engine-step"]
    assert state == "S" and source == "proc_mem", got
    assert functions[:2] == ["wait_for_lock", "step_thread"], functions
    state, source, functions = got["holder"]
    assert state == "S" and source == "proc_mem", got
    assert functions[0] == "holder_reads_pipe", functions
    wchan = daemon.query(
        "SELECT DISTINCT wchan, syscall FROM hang_dump_frames WHERE dump_id = ? AND thread_name = 'holder'",
        [dump_id],
    )
    assert wchan[0][1] == 0, wchan  # read(2)


def test_the_lock_dump_has_the_run_groups_other_process(traced):
    daemon, runs, _ = traced
    dump_id = _dump(daemon, runs["lock"])[0]
    pids = daemon.query(
        "SELECT DISTINCT thread_pid FROM hang_dump_stacks WHERE dump_id = ? ORDER BY 1", [dump_id]
    )
    assert sorted(p for (p,) in pids) == sorted([runs["lock"]["pid"], runs["peer"]["pid"]])
    state, source, functions = _threads(daemon, dump_id, own=False)["peer-waits"]
    assert state == "S" and source == "proc_mem" and "peer_waits" in functions, functions
    # the other hangs' engines are groups of their own
    for mode in ("spin", "ccall"):
        assert _threads(daemon, _dump(daemon, runs[mode])[0], own=False) == {}


def test_spin_names_the_spinning_function(traced):
    daemon, runs, _ = traced
    got = _threads(daemon, _dump(daemon, runs["spin"])[0])
    state, source, functions = got["engine-step"]
    assert "spin_forever" in functions and "step_thread" in functions, got
    assert source in ("sampler", "proc_mem") and state == "R", got
    assert runs["spin"]["states"][runs["spin"]["hanging"]["tid"]] == "R"  # still spinning


def test_the_spinner_never_stops_while_its_stacks_are_taken(traced):
    # The capture reads /proc and the sampler's frames: it never stops the
    # process. Inside each request's whole bracket (the capture inside it),
    # the spinning counter's longest pause is under half the capture's own
    # time (a process stopped for its capture pauses at least that long;
    # a running one about 0.15 ms), in the median of the 5 requests. Not
    # its rate: on this VM a spinner's rate drops by up to 37 % for a few
    # ms while the other vCPU is busy (the host's sibling), with the kernel
    # reporting it on CPU throughout. The control: the spinner's thread
    # seen stopped (SIGSTOP) and kept so for 2 ms fails the same measure
    # (no point of its series inside that bracket).
    _, runs, _ = traced
    series = runs["spin"]["series"]
    pauses = []
    for a, b, capture_ns in runs["spin"]["brackets"]:
        assert 0 < capture_ns < b - a, (capture_ns, b - a)
        pauses.append((_longest_pause(series, a, b) / capture_ns, capture_ns / 1e6))
    pauses.sort()
    print(f"the spinner's longest pause in a capture's bracket / the capture's time (capture ms): "
          f"{[(round(p, 3), round(c, 2)) for p, c in pauses]}")  # fmt: skip
    assert pauses[len(pauses) // 2][0] < 0.5, pauses
    [(a, b, stopped_ns)] = runs["spin"]["stopped"]
    control = _longest_pause(series, a, b)
    print(f"the control: SIGSTOP to SIGCONT {stopped_ns / 1e6:.2f} ms, longest pause "
          f"{control / 1e6:.2f} ms")  # fmt: skip
    assert control / stopped_ns >= 0.5, (control, stopped_ns)  # what the captures must not be


def test_long_c_call_names_its_caller_and_runs_on(traced):
    daemon, runs, _ = traced
    got = _threads(daemon, _dump(daemon, runs["ccall"])[0])
    state, source, functions = got["engine-step"]
    assert "long_c_call" in functions, got
    assert state == "R"
    if source == "sampler":  # the sampler's native leaf sits under the Python frames
        assert functions.index("long_c_call") >= 1
    assert runs["ccall"]["states"][runs["ccall"]["hanging"]["tid"]] == "R"


def test_an_idle_engine_is_never_hung(traced):
    daemon, runs, log = traced
    assert daemon.query("SELECT count(*) FROM hang_dumps WHERE pid = ?", [runs["idle"]["pid"]]) == [
        (0,)
    ]
    steps = daemon.query(
        "SELECT count(*) FROM spans s JOIN runs r USING (run_id) WHERE r.pid = ? AND s.kind = 'step'",
        [runs["idle"]["pid"]],
    )
    assert steps[0][0] > 10  # it did run steps, busy then idle


def test_metrics_count_hangs_and_the_silence_per_run_label(traced):
    _, runs, _ = traced
    m = runs["ccall"]["metrics"]  # scraped while the third engine was hung
    episodes = runs["ccall"]["episodes"]  # logged by then: 3 hangs (and any recovered before)
    assert episodes >= 3
    assert m[("stallscope_hangs_total", frozenset())] == episodes
    assert m[("stallscope_hang_dumps_total", frozenset({("outcome", "taken")}))] == episodes
    silence = m[("stallscope_seconds_since_last_step", frozenset({("run_label", "hang-ccall")}))]
    assert silence >= THRESHOLD_MS / 1000


def test_status_lists_the_dumps(traced):
    daemon, runs, _ = traced
    out = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "stallscope"), "status", "--db", daemon.db],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    section = out.split("## Hangs", 1)[1].split("##", 1)[0]
    for mode in ("lock", "spin", "ccall"):
        assert str(runs[mode]["pid"]) in section, section
    assert str(runs["idle"]["pid"]) not in section
    assert "per-run threshold" in section


def test_the_report_lists_each_dump_with_its_blocking_frames(traced):
    daemon, runs, _ = traced
    out = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "stallscope"), "report", "--db", daemon.db],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    section = out.split("== Hangs", 1)[1].split("\n== ", 1)[0]
    dumps = {
        int(ln.split("pid ")[1].split(",")[0]): ln
        for ln in section.splitlines()
        if ln.startswith("dump ")
    }
    for mode, frame in (
        ("lock", "wait_for_lock"),
        ("spin", "spin_forever"),
        ("ccall", "long_c_call"),
    ):
        assert runs[mode]["pid"] in dumps, section
        block = section.split(dumps[runs[mode]["pid"]], 1)[1].split("\ndump ", 1)[0]
        assert frame in block, block
    lock = section.split(dumps[runs["lock"]["pid"]], 1)[1].split("\ndump ", 1)[0]
    assert "holder_reads_pipe" in lock and "pipe_read" in lock, lock
    assert runs["idle"]["pid"] not in dumps


def test_the_live_stream_tells_each_hang_and_its_end(traced):
    daemon, runs, _ = traced
    events = runs["hung_events"]
    for mode in ("lock", "spin", "ccall"):
        run = runs[mode]
        dump_id = _dump(daemon, run)[0]
        mine = [
            (e.state, e.dump_id) for e in events if e.pid == run["pid"] and e.dump_id == dump_id
        ]
        # found hung, then the run left while hung (the engine was killed)
        assert mine == [("hung", dump_id), ("left", dump_id)], events
        (hung,) = [e for e in events if e.dump_id == dump_id and e.state == "hung"]
        assert hung.threads >= 2 and hung.threshold_ns == THRESHOLD_MS * 1_000_000, hung
        assert "per-run threshold" in hung.reason and hung.lacks == ""
    # a hang that ends in a step end: hung, then recovered (the stored row too)
    run = runs["pause"]
    dump_id = _dump(daemon, run)[0]
    mine = [e for e in events if e.dump_id == dump_id]
    assert [e.state for e in mine] == ["hung", "recovered"], events
    assert mine[0].detected_ns < mine[1].recovered_ns < run["resumed"]["ns"], mine
    stored = daemon.query("SELECT recovered_ns FROM hang_dumps WHERE dump_id = ?", [dump_id])
    assert stored == [(mine[1].recovered_ns,)], stored
    assert not [e for e in events if e.pid == runs["idle"]["pid"]], events
