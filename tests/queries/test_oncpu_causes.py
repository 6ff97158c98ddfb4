"""The on-CPU causes on the cpu fixture: `code` (and its frame), `submit` as
the fallback, `cpu_slow` only with power and evidence, and step_profile
(the goldens hold every column; these name the rule each row proves)."""

from pathlib import Path

import pytest

from helpers.schema_db import fresh_db
from stallscope.store import views

FIXTURES = Path(__file__).parent / "fixtures"
MS = 1_000_000


def load(name):
    con = fresh_db()
    con.execute((FIXTURES / f"{name}.sql").read_text())
    assert views.create_views(con) == []
    return con


def rows(con, where, view="step_attribution"):
    cur = con.execute(f"SELECT * FROM {view} WHERE {where} ORDER BY ALL")
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


@pytest.fixture(scope="module")
def cpu():
    return load("cpu")


def step(con, start_ms, tid=11):
    (r,) = rows(con, f"tid = {tid} AND start_ns = {start_ms * MS}")
    return r


@pytest.mark.parametrize(
    "start_ms, frame",
    [
        (2000, "Index.rebuild (index.py:40)"),  # a function normal steps never run
        (2020, "libz.so.1:deflate_slow <- Engine.step (engine.py:10)"),  # native: module:symbol
        (
            2040,
            "Engine.schedule (engine.py:30)",
        ),  # every step runs it; 5x its samples (lines tie: the lower frame id)
    ],
)
def test_code_names_the_frame(cpu, start_ms, frame):
    r = step(cpu, start_ms)
    assert r["cause"] == "code" and r["code_frame"] == frame
    assert r["code_ns"] >= 0.5 * r["excess_ns"] and r["cause_ns"] == r["code_ns"]
    assert r["cpu_slow_test"] is None  # a named step is no cpu_slow candidate


def test_kernel_samples_are_never_code(cpu):
    r = step(cpu, 2000)
    assert r["cpu_kernel_samples"] == 2 and r["cpu_samples"] == 15


def test_page_fault_time_is_capped_by_the_kernel_mode_samples(cpu):
    r = step(cpu, 2020)  # 12 ms measured, 0 kernel-mode samples: at most 3 samples' time
    assert r["page_faults"] == 400 and r["page_fault_ns"] == 3 * MS
    assert r["cause"] == "code"


def test_code_inside_submit_is_not_counted_twice(cpu):
    r = step(cpu, 2000)  # the rebuild ran inside a submit call 4 ms over its baseline
    assert r["submit_excess_ns"] == 4 * MS and r["submit_host_ns"] == 0


def test_submit_is_the_fallback_with_too_few_samples(cpu):
    r = step(cpu, 2100)  # 3 ms over in submit, one sample in a new function
    assert r["cause"] == "submit" and r["code_ns"] == 0 and r["code_frame"] is None


def test_cpu_slow_needs_power_and_evidence(cpu):
    slow = rows(cpu, "tid = 11 AND start_ns BETWEEN 3000 * 1e6 AND 3240 * 1e6")
    assert len(slow) == 7 and {r["cause"] for r in slow} == {"cpu_slow"}
    assert all(r["cpu_slow_power"] >= 0.9 for r in slow)  # as a population: 8 steps
    assert all(r["cpu_slow_ns"] == 10 * MS for r in slow)
    u1, u2 = slow[0], slow[1]
    assert u1["cpu_slow_evidence"] == ["other_task", "band"]
    assert (u1["other_task_pid"], u1["other_task_comm"], u1["other_task_ns"]) == (
        300,
        "hog",
        5 * MS,
    )
    assert u2["cpu_slow_evidence"] == ["steal", "band"] and u2["steal_ns"] == 2 * MS
    assert u1["band_share"] == 1.0 and u1["band_steps"] == 15  # thread 12's slow steps


def test_no_evidence_stays_unexplained(cpu):
    r = step(cpu, 6000)  # the same profile as u1..u7, alone in its second
    assert r["cause"] == "unexplained" and r["cpu_slow_test"] == "no_evidence"
    assert r["cpu_slow_ns"] == 0 and r["cpu_slow_evidence"] is None


def test_too_few_samples_stays_unexplained(cpu):
    r = step(cpu, 8200)  # one slow prefill step: no population to pool
    assert r["cause"] == "unexplained" and r["cpu_slow_test"] == "few_samples"
    assert r["cpu_slow_power"] < 0.9
    aux = rows(cpu, "tid = 12 AND slow")  # in the band, but no samples at all
    assert aux and {(r["cause"], r["cpu_slow_test"]) for r in aux} == {
        ("unexplained", "few_samples")
    }


def test_profile_root_holds_the_whole_excess(cpu):
    prof = rows(cpu, "tid = 11 AND step_idx = 42", view="step_profile")
    root = [p for p in prof if p["level"] == 0]
    assert len(root) == 1 and root[0]["excess_ns"] == 20 * MS and not root[0]["significant"]
    sched = [p for p in prof if p["frame"].startswith("Engine.schedule")]
    # lines 30 and 31 (stacks 101, 102) are one node; its excess, all of the step's
    assert len(sched) == 1 and sched[0]["samples"] == 22 and sched[0]["excess_ns"] == 20 * MS
    # the interpreter's own leaf is no node
    assert not any("libpython" in p["frame"] for p in prof)


def test_a_uniformly_slower_step_has_no_localized_excess(cpu):
    prof = rows(cpu, "tid = 11 AND step_idx = 44", view="step_profile")
    assert prof and not any(p["significant"] for p in prof)
    work = [p for p in prof if p["frame"].startswith("Engine.work")]
    assert work[0]["excess_ns"] == 8 * MS and abs(work[0]["localized_ns"]) < 0.1 * MS


def test_the_report_names_frames_evidence_and_why_unexplained(cpu, tmp_path):
    from stallscope.analysis.report import build_report

    text = build_report(cpu, out_dir=str(tmp_path))
    part = text[text.index("== On CPU") :]
    assert "Index.rebuild (index.py:40)" in part and "libz.so.1:deflate_slow" in part
    assert "`cpu_slow` steps: 7 (evidence: band 7, other_task 1, steal 1" in part
    # u8 (no evidence), the prefill step and thread 12's steps (too few samples)
    assert "tested, no evidence the CPU gave less 1" in part
    assert "too few samples to test 16" in part
    # the decode group's growing frames, largest excess first; Engine.work shrank: not listed
    table = part[part.index("group s:decode|b4") :]
    assert (
        table.index("Engine.schedule") < table.index("Index.rebuild") and "Engine.work" not in table
    )
    flames = sorted(p.name for p in tmp_path.glob("*flame*.png"))
    assert flames == ["run_1_flame_s_decode_b4.png", "run_1_flame_s_prefill_b1.png"]
    assert all((tmp_path / f).stat().st_size > 5000 for f in flames)


def test_perfetto_slow_step_slices_carry_the_code_frame(cpu, tmp_path):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pt

    from stallscope.analysis.access import FileSource
    from stallscope.export.perfetto import write_trace

    class Source(FileSource):  # the fixture's connection, as the CLI's file source reads one
        def __init__(self, con):
            self.con = con

    write_trace(Source(cpu), tmp_path / "t.pftrace")
    trace = pt.Trace()
    trace.ParseFromString((tmp_path / "t.pftrace").read_bytes())
    named = {}
    for p in trace.packet:
        if p.HasField("track_event") and p.track_event.name.startswith("step (slow"):
            a = {d.name: d for d in p.track_event.debug_annotations}
            named[p.timestamp] = (
                p.track_event.name,
                a["code_frame"].string_value if "code_frame" in a else None,
                a["cpu_slow_evidence"].string_value if "cpu_slow_evidence" in a else None,
            )
    assert named[2000 * MS] == ("step (slow: code)", "Index.rebuild (index.py:40)", None)
    assert named[3000 * MS] == ("step (slow: cpu_slow)", None, "other_task,band")
