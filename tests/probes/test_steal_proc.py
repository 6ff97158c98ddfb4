"""The steal probe on synthetic /proc/stat files and on the real one."""

import os
import time

import pytest

from helpers.sched import CollectSink
from stallscope.probes.base import ProbeSettings
from stallscope.probes.steal_proc import ProcStealProbe, read_steal_ticks

STAT = """cpu  100 0 50 1000 5 0 3 {total} 0 0
cpu0 50 0 25 500 2 0 1 {s0} 0 0
cpu1 50 0 25 500 3 0 2 {s1} 0 0
intr 12345 0 0
ctxt 999
"""


def write_stat(root, s0, s1):
    (root / "stat").write_text(STAT.format(total=s0 + s1, s0=s0, s1=s1))


def test_steal_rows_from_counter_deltas(tmp_path):
    write_stat(tmp_path, 10, 20)
    assert read_steal_ticks(str(tmp_path)) == {0: 10, 1: 20}
    sink = CollectSink()
    p = ProcStealProbe(ProbeSettings(proc_root=str(tmp_path)))
    p._sink = sink
    tick = p.tick_ns
    assert p.sample(now_ns=1_000_000_000) == 0  # the first read is the base
    write_stat(tmp_path, 10, 23)  # 3 ticks stolen on cpu1 only
    assert p.sample(now_ns=1_100_000_000) == 1
    write_stat(tmp_path, 12, 23)
    assert p.sample(now_ns=1_200_000_000) == 1
    write_stat(tmp_path, 12, 23)  # none: no row (coverage says it was looked at)
    assert p.sample(now_ns=1_300_000_000) == 0
    rows = sink.table("steal")
    assert list(rows["cpu"]) == [1, 0]
    assert list(rows["start_ns"]) == [1_000_000_000, 1_100_000_000]
    assert list(rows["end_ns"]) == [1_100_000_000, 1_200_000_000]
    assert list(rows["steal_ns"]) == [3 * tick, 2 * tick]


def test_missing_proc_is_a_clear_reason(tmp_path):
    reason = ProcStealProbe.unavailable(ProbeSettings(proc_root=str(tmp_path / "none")))
    assert "cannot read" in reason and "procfs" in reason


def test_real_sampling_runs():
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat")
    assert ProcStealProbe.unavailable(ProbeSettings()) is None
    sink = CollectSink()
    p = ProcStealProbe(ProbeSettings(steal_poll_ms=10))
    p.start(sink)
    try:
        deadline = time.monotonic() + 10
        while p.samples < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.samples >= 5 and p.covering()
    finally:
        p.stop()
    assert not p.covering()
    rows = sink.table("steal")
    if rows:  # this VM may or may not have been stolen from meanwhile
        assert (rows["steal_ns"] > 0).all() and (rows["end_ns"] > rows["start_ns"]).all()
