"""The Python mirror of the step rules agrees with the SQL views."""

import re
from pathlib import Path

import duckdb

from stallscope.store import views
from stallscope.store.database import apply_schema
from stallscope.vocab import rules

QUERIES = Path(__file__).resolve().parents[2] / "queries"


def test_step_params_defaults_match_the_constants():
    con = duckdb.connect()
    apply_schema(con)
    assert views.create_views(con) == []
    cur = con.execute("SELECT * FROM step_params")
    params = dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
    params.pop("gpu")  # no default: every GPU
    assert params, "step_params has no columns"
    for name, value in params.items():
        assert getattr(rules, name.upper()) == value, name


def test_every_cause_of_the_views_is_in_the_vocabulary():
    sql = (QUERIES / "step" / "09_attribution.sql").read_text()
    cause = sql[sql.index("WHEN NOT slow THEN NULL") : sql.index("END AS cause,")]
    named = set(re.findall(r"THEN '(\w+)'", cause)) | set(re.findall(r"ELSE '(\w+)'", cause))
    assert named == set(rules.CAUSES)
    # peer_wait's values are the other literals the view names
    assert re.search(r"END AS peer_wait", sql)
    waits = set(re.findall(r"THEN '(\w+)' ELSE '(\w+)' END\s+END AS peer_wait", sql)[0])
    assert waits == set(rules.PEER_WAITS)
    slow = (QUERIES / "seed" / "slow_steps.sql").read_text()
    assert set(re.findall(r"cause = '(\w+)'", slow)) == set(rules.CAUSES)
    # its top cause breaks ties in the same order
    top = re.findall(r"WHEN cause_\w+ THEN '(\w+)'", slow) + ["unexplained"]  # the ELSE
    assert tuple(top) == rules.CAUSES, top
    # the precedence of the CASE is the order of rules.CAUSES
    order = re.findall(r"WHEN \w+ THEN '(\w+)'", sql.split("CASE top_ns")[1])
    order.append(re.search(r"ELSE '(\w+)'\s+END", sql.split("CASE top_ns")[1]).group(1))
    assert tuple(order) == rules.CAUSES[: len(order)]
    assert set(rules.CAUSE_COLUMNS) == set(rules.CAUSES) - {"uncovered", "unexplained"}


def test_name_cause():
    assert rules.name_cause(10, {"gc": 5, "blocked": 5}) == "gc"  # tie: the earlier
    assert rules.name_cause(10, {"blocked": 4.99}) == "unexplained"
    assert rules.name_cause(10, {"blocked": 4}, uncovered=True) == "uncovered"
    assert rules.name_cause(10, {"preemption": 6, "lock": 1}) == "preemption"
    assert rules.is_idle(0) and not rules.is_idle(0, reports_batch=False)
    assert not rules.is_slow(13, 10, idle=True) and rules.is_slow(13, 10)


def test_every_cause_has_its_own_colour():
    from stallscope.analysis.report import CAUSE_COLOURS

    assert set(CAUSE_COLOURS) == set(rules.CAUSES)
    assert len(set(CAUSE_COLOURS.values())) == len(CAUSE_COLOURS)


def test_the_docs_table_has_the_precedence():
    """docs/queries.md's component table lists the causes in rules.CAUSES order."""
    doc = (QUERIES.parent / "docs" / "queries.md").read_text()
    table = re.findall(r"^ *\| (\d+) \| `(\w+)` \|", doc, re.M)
    assert [int(n) for n, _ in table] == list(range(1, len(table) + 1))
    assert tuple(c for _, c in table) == rules.CAUSES[: len(table)]
    assert len(table) == len(rules.CAUSES) - 2  # all but uncovered, unexplained


def test_the_fixed_on_cpu_numbers_match():
    """The on-CPU rules' fixed numbers are the ones rules.py mirrors."""
    prof = (QUERIES / "step" / "11_profile.sql").read_text()
    attr = (QUERIES / "step" / "09_attribution.sql").read_text()
    window = rules.OTHER_TASK_WINDOW_NS
    assert prof.count(str(window)) == 3 and f"least(o.prev_run_ns, {window})" in prof
    assert (
        f">= {rules.BAND_MIN_STEPS} AND (2 * band.up - band.m - 1) / sqrt(band.m) >= {rules.BAND_Z}"
        in attr
    )
    assert f"unnest([-{rules.BAND_HALF_WIDTH_S}, 0, {rules.BAND_HALF_WIDTH_S}])" in attr
    assert f"coalesce(max(sample_hz), {rules.DEFAULT_SAMPLE_HZ})" in prof
    assert list(rules.CPU_SLOW_EVIDENCE) == re.findall(
        r"'(\w+)'", attr[attr.index("list_filter(['other_task'") :].split("]")[0]
    )


def test_the_fill_version_is_the_views_and_a_schema_file():
    """_step_frontier reads stored rows of vocab.schema.STEP_FILL_VERSION only,
    and that number is a schema file's (the one that last added columns)."""
    from stallscope.vocab.schema import STEP_FILL_VERSION

    steps = (QUERIES / "step" / "01_steps.sql").read_text()
    assert f"f.fill_version = {STEP_FILL_VERSION};" in steps
    schema = QUERIES.parent / "daemon" / "stallscope" / "store" / "schema"
    (file,) = schema.glob(f"{STEP_FILL_VERSION}_*.sql")
    assert "step_components ADD COLUMN" in file.read_text()
