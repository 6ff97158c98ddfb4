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
    named = set(re.findall(r"THEN '(\w+)'", sql)) | set(re.findall(r"ELSE '(\w+)'", sql))
    # peer_wait's values are the other literals the view names
    waits = re.search(r"END AS peer_wait", sql) and set(rules.PEER_WAITS)
    assert waits and waits <= named
    assert named - waits == set(rules.CAUSES)
    slow = (QUERIES / "seed" / "slow_steps.sql").read_text()
    assert set(re.findall(r"cause = '(\w+)'", slow)) == set(rules.CAUSES)
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
