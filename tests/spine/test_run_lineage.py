"""Run groups at HELLO (ingest/runs.py): the parent from the kernel's ppid chain, the group key by uid.

`RunRegistry._lineage` on a fake /proc (the ingest's `proc_root` setting):
a process started by a traced one is its child and in its group; the
client's claimed parent only picks an ancestor that the kernel's chain
holds (a claim off the chain, or a lie, falls back to the nearest traced
ancestor); a group key joins runs of one uid only; a run with neither is a
group of its own. The real processes are in tests/run/test_run_groups.py
and tests/engines/test_vllm_run.py.
"""

from types import SimpleNamespace

from stallscope.ingest.records import RunState
from stallscope.ingest.runs import RunRegistry


class Registry(RunRegistry):
    def __init__(self, proc_root):
        self.proc_root = str(proc_root)
        self.runs = {}


def _proc(root, pid, ppid, comm="python3"):
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    # comm may hold spaces and parentheses: the parser reads after the last ')'
    (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0\n")


def _run(reg, run_id, pid, uid=1000, info=None):
    run = RunState(run_id, 0, pid, 0)
    conn = SimpleNamespace(pid=pid, uid=uid)
    lineage = reg._lineage(run, conn, info or {})
    reg.runs[run_id] = run
    return lineage


def test_a_child_of_a_traced_process_is_in_its_group(tmp_path):
    # 100 (launcher, untraced) -> 200 (traced caller) -> 300 (forkserver) -> 400 (worker)
    for pid, ppid in ((100, 1), (200, 100), (300, 200), (400, 300), (500, 100)):
        _proc(tmp_path, pid, ppid, comm="py (x) y" if pid == 300 else "python3")
    reg = Registry(tmp_path)
    assert _run(reg, 1, 200) == (None, "run:1", None)
    # the claim names the caller, on the chain two levels up: taken
    assert _run(reg, 2, 400, info={"parent_pid": 200, "rank": 3}) == (1, "run:1", 3)
    # a claim that is not on the kernel's chain (a sibling, a lie) is not taken
    assert _run(reg, 3, 500, info={"parent_pid": 400}) == (None, "run:3", None)


def test_the_nearest_traced_ancestor_wins_over_a_claim_off_the_chain(tmp_path):
    for pid, ppid in ((10, 1), (20, 10), (30, 20), (40, 1)):
        _proc(tmp_path, pid, ppid)
    reg = Registry(tmp_path)
    _run(reg, 1, 10)
    _run(reg, 2, 20)
    _run(reg, 3, 40)
    parent, group, _ = _run(reg, 4, 30, info={"parent_pid": 40})
    assert (parent, group) == (2, "run:1")  # 20, its kernel parent, in 10's group
    parent, group, _ = _run(reg, 5, 30, info={"parent_pid": 10})
    assert (parent, group) == (1, "run:1")  # the claim picks 10, which the chain holds


def test_a_group_key_joins_runs_of_the_same_uid_only(tmp_path):
    for pid in (11, 12, 13):
        _proc(tmp_path, pid, 1)
    reg = Registry(tmp_path)
    assert _run(reg, 1, 11, uid=1000, info={"group": "job-7"})[1] == "u1000:job-7"
    assert _run(reg, 2, 12, uid=1000, info={"group": "job-7"})[1] == "u1000:job-7"
    assert _run(reg, 3, 13, uid=1001, info={"group": "job-7"})[1] == "u1001:job-7"
    # a bad key is no key
    _proc(tmp_path, 14, 1)
    assert _run(reg, 4, 14, info={"group": "a\nb"})[1] == "run:4"
    assert _run(reg, 5, 14, info={"group": 7, "rank": "x"}) == (None, "run:5", None)


def test_an_explicit_key_beats_the_parents_group(tmp_path):
    _proc(tmp_path, 50, 1)
    _proc(tmp_path, 51, 50)
    reg = Registry(tmp_path)
    _run(reg, 1, 50)
    assert _run(reg, 2, 51, uid=0, info={"group": "ranks"}) == (1, "u0:ranks", None)


def test_no_proc_entry_means_no_parent(tmp_path):
    reg = Registry(tmp_path)
    _run(reg, 1, 60)
    assert _run(reg, 2, 61, info={"parent_pid": 60}) == (None, "run:2", None)
