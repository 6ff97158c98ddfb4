"""A store flush keeps off the CPU a traced step thread last ran on
(stallscope.threads.dodge_step_threads), while the daemon has another."""

import os
import threading

from stallscope import threads


def fake_stat(root, pid, tid, cpu, comm="python3 (x)"):
    d = root / str(pid) / "task" / str(tid)
    d.mkdir(parents=True)
    # fields 3.. after the comm; field 39 is the CPU it last ran on
    rest = ["S"] + ["0"] * 49
    rest[39 - 3] = str(cpu)
    (d / "stat").write_text(f"{tid} ({comm}) " + " ".join(rest) + "\n")


def in_a_thread(fn):
    out = {}

    def run():
        out["ret"] = fn()
        out["affinity"] = os.sched_getaffinity(0)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out


def test_the_flush_moves_off_the_step_threads_cpu(tmp_path):
    allowed = threads.allowed()
    step_cpu = min(allowed)
    fake_stat(tmp_path, 4242, 4243, step_cpu)
    threads.note_step_threads(4242, [4243])
    try:
        assert threads.step_thread_cpus(str(tmp_path)) == {step_cpu}
        got = in_a_thread(lambda: threads.dodge_step_threads(str(tmp_path)))
        expected = (allowed - {step_cpu}) or allowed  # one CPU: nowhere else to go
        assert got["ret"] == expected
        assert got["affinity"] == expected
    finally:
        threads.forget_step_threads(4242)


def test_gone_step_threads_give_the_cpus_back_and_others_pins_are_left(tmp_path):
    allowed = threads.allowed()
    fake_stat(tmp_path, 4242, 4243, min(allowed), comm="a ) b")
    threads.note_step_threads(4242, [4243, 4299])  # 4299 has no /proc entry
    try:
        assert threads.step_thread_cpus(str(tmp_path)) == {min(allowed)}
        assert threads._step_tids[4242] == {4243}  # the gone one is forgotten

        def narrowed_then_released():
            first = threads.dodge_step_threads(str(tmp_path))
            threads.forget_step_threads(4242)
            return first, threads.dodge_step_threads(str(tmp_path))

        got = in_a_thread(narrowed_then_released)
        assert got["ret"][0] == ((allowed - {min(allowed)}) or allowed)
        assert got["ret"][1] == allowed and got["affinity"] == allowed
    finally:
        threads.forget_step_threads(4242)

    # a thread pinned by someone else (a test, an operator's taskset) and
    # never narrowed here is left as it is: with dodging off, and with no
    # step thread to dodge
    def pinned(enabled):
        os.sched_setaffinity(0, {max(allowed)})
        threads.set_dodging(enabled)
        try:
            return threads.dodge_step_threads(str(tmp_path))
        finally:
            threads.set_dodging(True)

    threads.note_step_threads(4242, [4243])
    try:
        got = in_a_thread(lambda: pinned(False))
        assert got["ret"] is None and got["affinity"] == {max(allowed)}
    finally:
        threads.forget_step_threads(4242)
    got = in_a_thread(lambda: pinned(True))
    assert got["ret"] is None and got["affinity"] == {max(allowed)}
