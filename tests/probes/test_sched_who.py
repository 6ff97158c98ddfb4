"""Who took the CPU and who woke the thread: offcpu's preemptor_* and waker_* columns.

Real eBPF: a thread blocked on a pipe that a named sibling thread writes to
must name that sibling as its waker; a thread spinning on a CPU where a named
SCHED_FIFO process wakes up must name that process as its preemptor; a
thread that gives its CPU away in sched_yield() is told from one preempted
while it computes (`yielded`).
"""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from helpers.privileged import require_privileged
from helpers.sched import CollectSink, Workload, spawn_fifo, spawn_hog, window
from helpers.waiting import wait_for
from stallscope.probes.bpf_common import decode_comm
from stallscope.probes.sched_bcc import BccSchedProbe
from stallscope.probes.sched_resolve import TgidResolver

pytestmark = pytest.mark.privileged


@pytest.fixture(scope="module")
def probe():
    reason = BccSchedProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    p = BccSchedProbe()
    p.sink = CollectSink()
    p.start(p.sink)
    yield p
    p.stop()


@pytest.fixture
def work(probe):
    w = Workload()
    probe.track(w.pid)
    w.start_thread()
    yield w
    probe.untrack(w.pid)
    w.close()


def column(table, name):
    """A pyarrow column (possibly chunked over batches) as a Python list."""
    return list(table[name])


def rows(sink, tid):
    """offcpu rows of `tid` as a list of dicts (the who-columns are arrow arrays)."""
    out = []
    for batch in sink.batches.get("offcpu", []):
        n = len(batch["tid"])
        for i in range(n):
            if int(batch["tid"][i]) != tid:
                continue
            row = {}
            for k, v in batch.items():
                x = v[i]
                row[k] = x.item() if hasattr(x, "item") else x
            out.append(row)
    return out


def test_waker_is_the_sibling_that_wrote_the_pipe(probe, work):
    work.call("pin 0")
    work.call("wakeby 1")  # the sibling exists and has its name before the window
    w = window(work, "wakeby 30", probe.drain)
    waker_tid = int(w.reply)
    mine = [r for r in rows(probe.sink, work.tid) if w.t0_ns <= r["start_ns"] <= w.t1_ns]
    by_sibling = [r for r in mine if not r["preempted"] and r["waker_tid"] == waker_tid]
    # each of the 30 reads blocks until the sibling's write (unless the worker
    # was held off its CPU for the sibling's whole 1 ms delay, so allow a few)
    assert len(by_sibling) >= 25, [(r["preempted"], r["waker_tid"], r["waker_irq"]) for r in mine]
    named = [r for r in mine if r["waker_tid"] is not None]
    assert len(by_sibling) >= 0.9 * len(named)
    for r in by_sibling:
        assert r["waker_comm"] == "stall-waker"
        assert r["waker_pid"] == work.pid
        assert r["waker_irq"] is False
        assert r["start_ns"] <= r["wakeup_ns"] <= r["end_ns"]
    for r in mine:
        assert r["preemptor_tid"] is None or r["preempted"]


def test_sleep_is_woken_from_interrupt_context(probe, work):
    work.call("pin 0")
    w = window(work, "spin 200", probe.drain)  # 0.5 ms sleeps end by an hrtimer
    mine = [
        r
        for r in rows(probe.sink, work.tid)
        if w.t0_ns <= r["start_ns"] <= w.t1_ns and not r["preempted"]
    ]
    timer = [r for r in mine if r["waker_irq"]]
    assert len(timer) >= 5, mine
    for r in timer:
        assert r["waker_tid"] is None and r["waker_comm"] is None


def test_preemptor_is_the_fifo_process(probe, work):
    work.call("pin 1")
    # Other processes on this shared host must not take the worker's CPU:
    # the FIFO process can only preempt it while it runs, and the row's
    # prev_* name whoever ran between them. A nice -10 worker still lost CPU 1
    # to a busy nice-0 process (7 of 40 preemptions, or half the switch-ins
    # after another task, in 3 of 6 runs beside a test run); real-time
    # priority 1, below stall-fifo's 10, leaves CPU 1 to the two of them.
    os.sched_setscheduler(work.tid, os.SCHED_FIFO, os.sched_param(1))
    fifo = spawn_fifo(1, bursts=40)
    try:
        work.send("spin 400")
        fifo.stdin.write("go\n")
        fifo.stdin.flush()
        assert fifo.stdout.readline().strip() == "done"
        assert work.proc.stdout.readline().strip() == "done"
        work.wait_sleeping()
        work.call("noop")
        probe.drain()
    finally:
        fifo.kill()
        fifo.wait()
        os.sched_setscheduler(work.tid, os.SCHED_OTHER, os.sched_param(0))
    mine = [r for r in rows(probe.sink, work.tid) if r["preempted"]]
    by_fifo = [r for r in mine if r["preemptor_tid"] == fifo.pid]
    # the worker runs most of the time: many of the 40 wake-ups preempt it
    assert len(by_fifo) >= 8, [(r["preemptor_tid"], r["preemptor_comm"]) for r in mine]
    for r in by_fifo:
        assert r["preemptor_comm"] == "stall-fifo"
        assert r["preemptor_pid"] == fifo.pid
        assert r["waker_tid"] is None and r["wakeup_ns"] is None
    # the switch-in ending each such row names who held the CPU until then
    # (offcpu.prev_*, the `other_task` evidence): mostly the FIFO process
    # after its 2 ms spin (another task may run between it and the worker)
    after = sorted((r for r in by_fifo if r["prev_pid"] == fifo.pid), key=lambda r: r["start_ns"])
    assert len(after) >= 0.5 * len(by_fifo), [(r["prev_pid"], r["prev_comm"]) for r in by_fifo]
    for r in after:
        assert r["prev_comm"] == "stall-fifo" and r["prev_run_ns"] <= 50_000_000, r
    # each burst spins 2 ms; only the first preemption may be shorter: the
    # "go" line wakes stall-fifo, which runs ~0.1 ms up to its first sleep
    assert all(r["prev_run_ns"] >= 500_000 for r in after[1:]), [r["prev_run_ns"] for r in after]


# Pinned to one CPU beside a hog: rounds of ~20 ms of computing (the hog
# preempts it at ticks) then 30 sched_yield() calls (each hands the CPU to
# the hog), each phase's monotonic bounds printed as "spin|yield T0 T1".
YIELDER = """
import os, sys, time
os.sched_setaffinity(0, {CPU})
sys.stdin.readline()
for _ in range(ROUNDS):
    t0 = time.monotonic_ns()
    while time.monotonic_ns() - t0 < 20_000_000:
        pass
    t1 = time.monotonic_ns()
    for _ in range(30):
        os.sched_yield()
    t2 = time.monotonic_ns()
    print("spin", t0, t1)
    print("yield", t1, t2)
print("done", flush=True)
"""


def test_a_yield_is_told_from_a_preemption(probe):
    assert probe.yields_known, f"sched_yield's number unknown on {os.uname().machine}"
    code = YIELDER.replace("CPU", "1").replace("ROUNDS", "15")
    hog = spawn_hog(1)
    y = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        probe.track(y.pid)
        y.stdin.write("go\n")
        y.stdin.flush()
        out, _ = y.communicate(timeout=60)
        probe.drain()
    finally:
        probe.untrack(y.pid)
        hog.kill()
        hog.wait()
    assert out.splitlines()[-1] == "done"
    phases = [(kind, int(a), int(b)) for kind, a, b in (ln.split() for ln in out.splitlines()[:-1])]
    mine = [r for r in rows(probe.sink, y.pid) if r["preempted"]]

    def phase(ns):
        return next((k for k, a, b in phases if a <= ns < b), None)

    yields = [r for r in mine if phase(r["start_ns"]) == "yield"]
    spins = [r for r in mine if phase(r["start_ns"]) == "spin"]
    # 15 rounds x 30 yields, each with a runnable hog on the CPU: most
    # switch out (the hog may still be running out its own slice)
    assert len(yields) >= 100, (len(yields), len(spins))
    # 15 x 20 ms of computing beside an equal hog: preempted at ticks
    assert len(spins) >= 15, (len(yields), len(spins))
    assert all(r["yielded"] is True for r in yields), [r["yielded"] for r in yields]
    assert all(r["yielded"] is False for r in spins), [r["yielded"] for r in spins]
    # the task that ran meanwhile is still recorded (the hog, mostly)
    assert sum(r["preemptor_tid"] == hog.pid for r in yields) >= 0.5 * len(yields)


def test_a_kernel_that_refuses_the_yield_read_still_gets_the_probe(monkeypatch):
    """Where the yield's read does not load (a kernel before 5.15 has no
    bpf_task_pt_regs), the probe loads without it: yielded stays NULL."""
    from stallscope.probes import sched_bcc

    monkeypatch.setattr(sched_bcc, "yield_cflags", lambda: ["-DYIELD_NR=no_such_symbol"])
    p = BccSchedProbe()
    sink = CollectSink()
    p.start(sink)
    try:
        assert p.yields_known is False and p.status()["yields_known"] is False
        w = Workload()
        p.track(w.pid)
        w.start_thread()
        window(w, "spin 20", p.drain)
        p.untrack(w.pid)
        w.close()
        p.drain()
    finally:
        p.stop()
    batches = sink.batches.get("offcpu", [])
    assert batches and all("yielded" not in b for b in batches)


def test_resolver_reads_tgid_from_proc(tmp_path):
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "status").write_text("Name:\tx\nTgid:\t70\nPid:\t77\n")
    r = TgidResolver(str(tmp_path))
    pids = r.fill(np.array([77, 0, 99]), np.array([0, 0, 5]))
    assert list(pids) == [70, 0, 5]
    assert r.tgid(12345) == 0  # gone: 0, not cached
    assert r.tgid(77) == 70 and r.lookups == 2
    # the real /proc: this thread's tgid is our pid
    assert TgidResolver().tgid(threading.get_native_id()) == os.getpid()


@pytest.mark.parametrize("collide", [False, True])
def test_comm_columns_decode_once_per_value(monkeypatch, collide):
    from stallscope.probes import bpf_common

    if collide:  # every value hashes alike: the check must still part them
        monkeypatch.setattr(bpf_common, "_ROW_MIX", np.zeros_like(bpf_common._ROW_MIX))
    values = np.array([b"python", b"kworker/0:1", b"python", b"", b"stall-waker"], dtype="S16")
    a, b = decode_comm(values, np.array([1, 1, 0, 1, 1], bool), np.array([0, 1, 1, 0, 0], bool))
    assert a.to_pylist() == ["python", "kworker/0:1", None, "", "stall-waker"]
    assert b.to_pylist() == [None, "kworker/0:1", "python", None, None]
    assert len(a.dictionary) == 4  # "python" decoded once
    assert decode_comm(values[:0], np.array([], bool))[0].to_pylist() == []


def test_resolver_names_an_ended_daemon_thread_as_the_daemon(tmp_path):
    """A daemon thread that preempted a traced thread and ended before the
    drain has no /proc entry left: it is still the daemon's (its preemptor_pid
    is not NULL); a gone thread that was never ours stays unknown (0)."""
    from stallscope import threads

    tids = []

    def daemon_thread():
        tids.append(threading.get_native_id())
        threads.background("test-ended")
        threads.forget()

    t = threading.Thread(target=daemon_thread)
    t.start()
    t.join()
    gone = tids[0]
    # join() returns before the kernel has reaped the thread
    assert wait_for(lambda: not os.path.exists(f"/proc/self/task/{gone}"), timeout_s=10)
    r = TgidResolver()
    assert r.tgid(gone) == os.getpid()
    assert list(r.fill(np.array([gone]), np.array([0]))) == [os.getpid()]
    # a foreign task that ended: never ours, so unknown
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not threads.was_own_thread(child.pid)
    assert r.tgid(child.pid) == 0
