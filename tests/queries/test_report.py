"""The report and the comparison on a synthetic two-run database."""

import re

import numpy as np
import pyarrow as pa
import pytest
from db import MS, add_run, add_span, new_db

from stallscope.analysis.compare import RunNotFound, compare_runs
from stallscope.analysis.formatting import format_rows
from stallscope.analysis.report import attribution_read_once, build_report

N = 2000  # steps per run
STALL = 1501  # index of the step the gen-2 pass stalls in run 1


def build_db():
    """Run 1 (A): 5 ms steps, one 100 ms gen-2 pass inside step 1500.
    Run 2 (B): the same steps 10% slower and no gen-2 pass."""
    con = new_db()
    con.execute(
        "INSERT INTO runs (run_id, pid, label) VALUES (1, 100, 'before'), (2, 200, 'freeze')"
    )
    for run_id, factor in ((1, 1.0), (2, 1.1)):
        dur = np.full(N, round(5 * MS * factor), dtype=np.int64)
        dur[::2] += 10_000  # two shapes of duration, so medians are not trivial
        if run_id == 1:
            dur[STALL] = 105 * MS
        start = 10**9 * run_id * 100 + np.cumsum(dur + MS) - (dur + MS)
        stage = np.where(np.arange(N) % 4 == 0, "prefill", "recurrent")
        tbl = pa.table(
            {
                "run_id": np.full(N, run_id),
                "tid": np.full(N, 11 + run_id),
                "kind": ["step"] * N,
                "stage": stage,
                "batch": np.full(N, 4, dtype=np.int32),
                "start_ns": start,
                "end_ns": start + dur,
                "depth": np.zeros(N, np.int16),
                "seq": np.arange(N),
            }
        )
        con.register("_t", tbl)
        con.execute("INSERT INTO spans BY NAME SELECT * FROM _t")
        con.unregister("_t")
        if run_id == 1:
            gs = int(start[STALL]) + 2 * MS
            con.execute(
                "INSERT INTO gc_events (run_id, tid, generation, start_ns, end_ns, collected) "
                "VALUES (1, 12, 2, ?, ?, 1172)",
                [gs, gs + 100 * MS],
            )
        for k in range(5):  # gen-0 passes of 0.5 ms in steps 100, 300, ...
            gs = int(start[100 + 200 * k]) + MS
            con.execute(
                "INSERT INTO gc_events (run_id, tid, generation, start_ns, end_ns, collected) "
                "VALUES (?, ?, 0, ?, ?, 10)",
                [run_id, 11 + run_id, gs, gs + MS // 2],
            )
    return con


@pytest.fixture(scope="module")
def con():
    return build_db()


def test_report_text_has_the_numbers(con, tmp_path):
    text = build_report(con, out_dir=str(tmp_path))
    assert "2 runs, 4,000 steps" in text
    gen2 = text.split("== Generation-2 collections ==")[1].split("==")[0]
    row = [ln for ln in gen2.splitlines() if ln.split()[:2] == ["1", "before"]]
    assert len(row) == 1
    # step 1,501 of 2,000 (0-based index), 100 ms pause, 1172 objects, 105 ms recurrent step
    assert "1,501 / 2,000" in row[0] and "100.0" in row[0] and "1172" in row[0]
    assert "recurrent" in row[0] and "105.0" in row[0]
    assert "1 generation-2 pass in 1 run;" in gen2 and "1 stalled a non-prefill step" in gen2
    runs = text.split("== Runs ==")[1].split("==")[0]
    line = [ln for ln in runs.splitlines() if ln.split()[:2] == ["1", "before"]][0]
    r1 = line.split()
    # run 1: 1 step over 100 ms, not prefill, overlapping a GC pass; 5 gen-0
    # passes of 0.5 ms, no gen-1 (its max is NULL: blank), 1 gen-2 of 100 ms
    assert r1[2] == "2000" and r1[7:10] == ["1", "1", "0"] and r1[11:14] == ["5", "2.5", "0.5"]
    assert re.search(r"\s0\s+0\.0\s+1\s+100\.0\s+100\.0$", line)
    slow = text.split("== Slow steps")[1].split("\n== ")[0]
    rec = [ln for ln in slow.splitlines() if ln.startswith("recurrent")]
    # run 1's stalled step is its only slow one: 1 of 3000 recurrent steps in both runs
    assert rec and rec[0].split()[2:4] == ["3000", "1"] and " gc " in rec[0]


def test_report_figures_exist_and_show_red(con, tmp_path):
    import matplotlib.image as mpimg

    text = build_report(con, out_dir=str(tmp_path), run_ids=[1])
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["run_1_gen2_1.png", "run_1_steps.png"]
    assert all(str(tmp_path / p) in text for p in pngs)
    for p in pngs:
        img = mpimg.imread(tmp_path / p)
        assert (tmp_path / p).stat().st_size > 10_000 and img.shape[0] > 300
        rgb = img[..., :3]
        # the stalled step is drawn in tab:red (0.84, 0.15, 0.16)
        red = (rgb[..., 0] > 0.7) & (rgb[..., 1] < 0.3) & (rgb[..., 2] < 0.3)
        assert red.sum() > 20, p


def test_report_run_filter(con):
    text = build_report(con, run_ids=[2])
    assert "1 run, 2,000 steps" in text and "(no generation-2 collection)" in text
    assert "Figures" not in text


class _ApiLike:
    """A connection that is not DuckDB's (as the daemon's API lends one):
    the report cannot make tables on it and reads the view each time."""

    def __init__(self, con):
        self._con = con

    def execute(self, sql, params=None):
        return self._con.execute(sql, params or [])


def _temporary_tables(con):
    return con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()


def test_the_report_is_the_same_with_step_attribution_read_once(con):
    assert build_report(con) == build_report(_ApiLike(con))
    assert _temporary_tables(con) == []  # dropped at the end


def test_step_attribution_read_once_stands_in_for_the_view_until_the_block_ends():
    con = new_db()
    add_run(con, 1, 100)
    for k in range(3):
        add_span(con, 1, 11, "step", 10 * k, 10 * k + 5)
    count = "SELECT count(*) FROM step_attribution"
    with attribution_read_once(con):
        add_span(con, 1, 11, "step", 30, 35)
        # the rows as they were: every view and section reads the one table
        assert con.execute(count).fetchone()[0] == 3
        assert con.execute("SELECT steps FROM seed_runs").fetchall() == [(3,)]
        assert con.execute("SELECT count(*) FROM _step").fetchone()[0] == 4  # not a view of it
        with attribution_read_once(con):  # nested (the demo's A/B around the report): one table
            assert _temporary_tables(con) == [("step_attribution",)]
        assert _temporary_tables(con) == [("step_attribution",)]
    assert con.execute(count).fetchone()[0] == 4
    assert con.execute("SELECT steps FROM seed_runs").fetchall() == [(4,)]
    with pytest.raises(RuntimeError), attribution_read_once(con):
        raise RuntimeError("a section failed")
    assert _temporary_tables(con) == []


def test_compare_ratios(con):
    text = compare_runs(con, "before", 2)
    assert "A = run 1 (before), B = run 2 (freeze)" in text
    over = text.split("== Overview ==")[1].split("==")[0]
    assert re.search(r"gen-2 passes\s+1\s+0\s+0\.0", over)
    assert re.search(r"steps > 100 ms\s+1\s+0", over)
    shapes = text.split("per stage and batch ==")[1]
    rec = [ln for ln in shapes.splitlines() if ln.startswith("recurrent")][0].split()
    # recurrent steps: 1000 of 5 ms and 500 of 5.01 ms (x 1.1 in B): medians 5.0 and 5.5
    assert rec[4:7] == ["5.0", "5.5", "1.1"]
    stages = text.split("per stage ==")[1].split("==")[0]
    pre = [ln for ln in stages.splitlines() if ln.startswith("prefill")][0].split()
    assert pre[1:3] == ["500", "500"]


def test_compare_unknown_run_says_what_exists(con):
    with pytest.raises(RunNotFound, match=r"no run 'nope'.*2 \(freeze\), 1 \(before\)"):
        compare_runs(con, 1, "nope")


def test_format_rows_all_formats():
    cols = ["run_id", "label", "pause_ms", "stall"]
    rows = [(1, "run_01", 99.5, True), (12, None, 1.25, False)]
    table = format_rows(cols, rows, "table").splitlines()
    assert table[0].split() == cols and len({len(ln) for ln in table[:2]}) == 1
    assert table[2].index("99.5") + 4 == table[3].index("1.25") + 4  # numbers right-aligned
    assert (
        format_rows(cols, rows, "csv")
        == "run_id,label,pause_ms,stall\n1,run_01,99.5,true\n12,,1.25,false\n"
    )
    assert (
        format_rows(cols, rows, "json").splitlines()[1]
        == '{"run_id": 12, "label": null, "pause_ms": 1.25, "stall": false}'
    )
    with pytest.raises(ValueError, match="use one of table, csv, json"):
        format_rows(cols, rows, "xml")


def test_the_report_names_each_group_its_roles_and_the_late_peers_cause():
    from pathlib import Path

    from helpers.schema_db import fresh_db

    con = fresh_db()
    con.execute((Path(__file__).parent / "fixtures" / "peer.sql").read_text())
    con.execute(
        "INSERT INTO run_events (run_id, kind, message) VALUES (1, 'role', 'engine core'), "
        "(2, 'role', 'worker')"
    )
    con.execute("UPDATE runs SET rank = run_id - 3 WHERE run_id IN (4, 5)")
    text = build_report(con)
    section = text.split("== Run groups")[1].split("\n== ")[0]
    rows = [line.split() for line in section.splitlines()]
    assert ["run:1", "1", "vllm", "100", "engine", "core", "8", "2", "1"] in rows
    assert ["run:1", "2", "vllm/child-200", "200", "1", "worker", "8", "1", "0"] in rows
    assert ["u0:job", "5", "rank2", "500", "rank", "2", "8", "1", "0"] in rows
    assert not any(r and r[0] == "run:9" for r in rows)  # a group of one is no group
    causes = section.split("Cross-process causes")[1]
    assert re.search(r"^\s+1\s+2\s+gc\s+1\s+20\.0\s+1\s+spun$", causes, re.M)
    assert re.search(r"^\s+3\s+5\s+preemption\s+1\s+15\.0\s+1\s+15\.0\s+spun$", causes, re.M)
    assert re.search(r"^\s+6\s+8\s+gc\s+1\s+20\.0\s+2\s+1\.0\s+spun$", causes, re.M)
