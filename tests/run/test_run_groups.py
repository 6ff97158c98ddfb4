"""Run groups and peer spans on real processes: a driver and two ranks exchanging work through shared memory.

`stallscope run --group job -- python ranks.py` starts a driver (RANK=0) that
starts two rank processes (RANK=1, 2; children of the traced driver, so
traced too, in its group). Each driver step posts work item k into a
shared-memory block (a MAP_SHARED mapping of one file) and spins (sched_yield) until both ranks posted k done;
each rank polls for item k, then runs its step (~3 ms of arithmetic) and
posts it. Rank 2 runs a full GC pass over a heap of live cycles (16-24 ms
here) inside its steps GC_STEPS: at those steps the driver's step is `peer` with
the late rank (run of rank 2, `peer_late_ns`: how much after rank 1) and its
cause (`gc`) named (a driver preempted after its ranks finished is
unmatched, as the rule says: checked from the spans, at most one of the
three), and the report's group section says so. Needs no root
and no engine: stdlib processes, the daemon with no kernel probe.
"""

import re
import subprocess
import sys

import pytest

from stallscope.vocab import rules

pytestmark = pytest.mark.daemon

STEPS = 60
GC_STEPS = (15, 30, 45)

WORK = """
import gc, os, time

class Driver:
    def __init__(self, cells):
        self.cells = cells

    def step(self, k):
        self.cells[0] = k
        while self.cells[1] != k or self.cells[2] != k:
            os.sched_yield()  # spin-wait for both ranks (on CPU, like vLLM's engine core)


class Rank:
    def __init__(self, rank, gc_steps):
        self.rank = rank
        self.gc_steps = gc_steps
        self.heap = []

    def step(self, k):
        x = 0
        for i in range(20000):  # ~3 ms of arithmetic
            x += i * i
        if k in self.gc_steps:
            gc.collect()
        return x
"""

MAIN = '''
import gc, mmap, os, subprocess, sys, time
from ranksw import Driver, Rank

STEPS, GC_STEPS = {steps}, {gc_steps}

def shared(path):
    """64 bytes of shared memory (a MAP_SHARED file mapping) as 8 int64 cells."""
    fd = os.open(path, os.O_RDWR)
    mem = mmap.mmap(fd, 64)
    os.close(fd)
    return mem, memoryview(mem).cast("q")

def rank_main(rank, path):
    mem, cells = shared(path)
    worker = Rank(rank, GC_STEPS if rank == 2 else ())
    if rank == 2:
        for _ in range(400000):  # live cycles: a full pass walks them (16-24 ms here)
            node = []
            node.append(node)
            worker.heap.append(node)
    cells[2 + rank] = 1  # ready
    for k in range(1, STEPS + 1):
        while cells[0] != k:
            time.sleep(0.00005)
        worker.step(k)
        cells[rank] = k
    cells.release()
    mem.close()

if __name__ == "__main__":
    if len(sys.argv) > 1:
        rank_main(int(sys.argv[1]), sys.argv[2])
        sys.exit(0)
    gc.disable()  # the driver's own passes stay out of its steps
    path = os.path.abspath("cells.bin")
    with open(path, "wb") as f:
        f.write(bytes(64))
    mem, cells = shared(path)
    ranks = [subprocess.Popen([sys.executable, __file__, str(r), path],
                              env=dict(os.environ, RANK=str(r))) for r in (1, 2)]
    while cells[3] != 1 or cells[4] != 1:
        time.sleep(0.001)
    driver = Driver(cells)
    for k in range(1, STEPS + 1):
        driver.step(k)
        time.sleep(0.002)
    codes = [p.wait(timeout=60) for p in ranks]
    driver.cells = None
    cells.release()
    mem.close()
    print("ok", codes, flush=True)
'''


@pytest.fixture
def ranks_run(tmp_path, daemon):
    folder = tmp_path / "ranks"
    folder.mkdir()
    (folder / "ranksw.py").write_text(WORK)
    (folder / "ranks.py").write_text(MAIN.format(steps=STEPS, gc_steps=GC_STEPS))
    done = subprocess.run(
        [
            sys.executable, "-m", "stallscope.cli", "run", "--socket", daemon.socket,
            "--label", "ranks", "--group", "job",
            "--attach", "ranksw:Driver.step=step,batch=1",
            "--attach", "ranksw:Rank.step=step,batch=1",
            "--", sys.executable, "ranks.py",
        ],
        cwd=folder, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "RANK": "0"},
    )  # fmt: skip
    daemon.stop()
    assert done.returncode == 0 and "ok [0, 0]" in done.stdout, done.stderr[-3000:]
    return daemon


def test_the_late_rank_and_its_cause_are_named(ranks_run):
    q = ranks_run.query
    runs = q("SELECT run_id, rank, parent_run_id, group_key FROM runs ORDER BY run_id")
    assert len(runs) == 3 and len({g for *_, g in runs}) == 1
    assert runs[0][3] == "u0:job" or runs[0][3].endswith(":job")
    by_rank = {rank: run_id for run_id, rank, _, _ in runs}
    assert sorted(by_rank) == [0, 1, 2]
    assert all(p == by_rank[0] for r, _, p, _ in runs if r != by_rank[0])
    steps = q(
        "SELECT step_idx, slow, cause, peer_run_id, peer_cause, peers, peer_late_ns, peer_ns, "
        "excess_ns FROM step_attribution WHERE run_id = ? ORDER BY step_idx",
        [by_rank[0]],
    )
    assert len(steps) == STEPS
    stalled = [s for s in steps if s[0] + 1 in GC_STEPS]
    bounds = {
        run_id: q(
            "SELECT start_ns, end_ns FROM spans WHERE run_id = ? AND kind = 'step' "
            "ORDER BY start_ns",
            [run_id],
        )
        for run_id in by_rank.values()
    }
    matched = 0
    for idx, slow, cause, peer_run, peer_cause, peers, late_ns, peer_ns, excess in stalled:
        assert slow, steps[idx]
        if peer_run is None:
            # Unmatched only as the rule says: the driver ended more than
            # peer_end_gap_ns + peer_end_gap_share of the late rank's time
            # inside the step after that rank's step (the driver preempted
            # after its ranks finished, invisible without a sched probe).
            d0, d1 = bounds[by_rank[0]][idx]
            r0, r1 = bounds[by_rank[2]][idx]
            inside = r1 - max(r0, d0)
            assert d1 - r1 > rules.PEER_END_GAP_NS + rules.PEER_END_GAP_SHARE * inside, (
                steps[idx],
                d1 - r1,
                inside,
            )
            continue
        matched += 1
        assert cause == "peer", steps[idx]
        assert peer_run == by_rank[2] and peer_cause == "gc" and peers == 2
        # peer_late_ns is rank 2's end less rank 1's (the definition, from
        # the spans), and rank 2's GC pass in that step is most of it: rank 1
        # shares 2 CPUs with the spinning driver and rank 2, so its own end
        # may slip by some ms, never by half the pass (a fixed floor in ms
        # failed in CI: 14.1 ms late; passes here are 16-24 ms)
        ends = {r: bounds[by_rank[r]][idx][1] for r in (1, 2)}
        assert late_ns == ends[2] - ends[1], (steps[idx], ends)
        r0, r1 = bounds[by_rank[2]][idx]
        gc_ns = q(
            "SELECT coalesce(sum(end_ns - start_ns), 0) FROM gc_events "
            "WHERE run_id = ? AND start_ns >= ? AND end_ns <= ?",
            [by_rank[2], r0, r1],
        )[0][0]
        assert gc_ns >= 5_000_000 and late_ns >= gc_ns / 2, (steps[idx], gc_ns)
        assert peer_ns >= excess / 2, steps[idx]
    assert matched >= len(GC_STEPS) - 1, stalled
    # the other steps waited for whichever rank finished last (both ranks seen
    # in most of them: a step preempted after its ranks finished is unmatched),
    # and none of them is the GC's
    rest = [s for s in steps if s[0] + 1 not in GC_STEPS]
    assert sum(s[5] == 2 for s in rest) >= 0.7 * len(rest), rest
    assert not [s for s in rest if s[2] == "peer" and s[4] == "gc"]
    # rank 2's own steps at those points are gc
    own = q("SELECT step_idx, cause FROM step_attribution WHERE run_id = ? AND slow", [by_rank[2]])
    assert {i + 1 for i, c in own if c == "gc"} >= set(GC_STEPS)


def test_the_report_names_the_ranks_and_the_late_ones_cause(ranks_run):
    done = subprocess.run(
        [sys.executable, "-m", "stallscope.cli", "report", "--db", ranks_run.db],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    section = done.stdout.split("== Run groups")[1].split("\n== ")[0]
    for rank in (0, 1, 2):
        assert f"rank {rank}" in section
    late = section.split("Cross-process causes")[1]
    assert re.search(r"^\s*\d+\s+\d+\s+gc\s+3\s", late, re.M), section
