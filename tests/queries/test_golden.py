"""Golden tests of the named queries: fixture, query, expected CSV.

Each `cases/NAME.sql` names its fixture on its first line (`-- fixture:
basic`) and holds one query; the rows it returns on a fresh database holding
that fixture must equal `golden/NAME.csv`. The goldens were written by hand
from the fixture's comments and checked against the rules in
docs/queries.md; `STALLSCOPE_UPDATE_GOLDEN=1` rewrites them (review the diff).
"""

import csv
import io
import os
import re
from pathlib import Path

import duckdb
import pytest

from helpers.schema_db import fresh_db
from stallscope.store.database import apply_schema

HERE = Path(__file__).parent
CASES = sorted((HERE / "cases").glob("*.sql"))


def render(columns, rows):
    """Rows as CSV text: NULL empty, booleans true/false, floats as repr."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        w.writerow(
            [
                "" if v is None else ("true" if v is True else "false" if v is False else v)
                for v in row
            ]
        )
    return out.getvalue()


def run_case(path):
    text = path.read_text()
    first = text.splitlines()[0]
    assert first.startswith("-- fixture:"), f"{path.name}: first line must name the fixture"
    fixture = HERE / "fixtures" / (first.split(":", 1)[1].strip() + ".sql")
    con = fresh_db()
    con.execute(fixture.read_text())
    cur = con.execute(text)
    return render([d[0] for d in cur.description], cur.fetchall())


def test_every_query_file_loads():
    con = duckdb.connect()
    apply_schema(con)
    from stallscope.store import views

    assert views.create_views(con) == []


def test_every_view_has_a_golden_case():
    """Every public view of queries/step, queries/seed and queries/request (other
    areas test their own)."""
    root = Path(__file__).resolve().parents[2] / "queries"
    public = set()
    for path in (
        sorted(root.glob("step/*.sql"))
        + sorted(root.glob("seed/*.sql"))
        + sorted(root.glob("request/*.sql"))
    ):
        public |= {
            m
            for m in re.findall(r"CREATE OR REPLACE VIEW (\w+)", path.read_text())
            if not m.startswith("_")
        }
    assert "step_attribution" in public
    cased = {p.stem for p in CASES}
    assert public - cased == set(), "views without a golden case"


@pytest.mark.parametrize("case", CASES, ids=[p.stem for p in CASES])
def test_golden(case):
    got = run_case(case)
    golden = HERE / "golden" / (case.stem + ".csv")
    if os.environ.get("STALLSCOPE_UPDATE_GOLDEN") == "1":
        golden.write_text(got)
    assert golden.exists(), f"no golden file {golden}"
    assert got == golden.read_text()
