"""Every public view and macro of queries/ has its row in docs/queries.md.

The docs' file table (`| file | views |`) names, per query file, the
public views and macros it defines; a view added without its row, or a row
naming what no file defines, fails here.
"""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
QUERIES = REPO / "queries"
DOC = REPO / "docs" / "queries.md"
DEFINITION = re.compile(
    r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:VIEW|MACRO)\s+([A-Za-z_][A-Za-z0-9_]*)", re.I
)


def defined():
    """{query file relative to queries/: {public names it defines}}."""
    out = {}
    for path in sorted(QUERIES.rglob("*.sql")):
        names = {n for n in DEFINITION.findall(path.read_text()) if not n.startswith("_")}
        out[str(path.relative_to(QUERIES))] = names
    return out


def documented(text=None):
    """{file: {public names in its row}} from the docs' file table."""
    text = DOC.read_text() if text is None else text
    out = {}
    for line in text.splitlines():
        m = re.match(r"\|\s*`([a-z_]+/[0-9A-Za-z_]+\.sql)`\s*\|(.*)\|\s*$", line)
        if m:
            names = set(re.findall(r"`([a-z][A-Za-z0-9_]*)(?:\([^)]*\))?`", m.group(2)))
            out[m.group(1)] = names
    return out


def test_every_query_file_has_a_row_with_its_public_names():
    have, doc = defined(), documented()
    assert sum(len(v) for v in have.values()) > 20
    missing = {f: sorted(names - doc.get(f, set())) for f, names in have.items()}
    assert {f: n for f, n in missing.items() if n} == {}, "add them to docs/queries.md"
    assert set(doc) <= set(have), f"rows for files that do not exist: {set(doc) - set(have)}"
    extra = {f: sorted(doc[f] - have[f]) for f in doc if doc[f] - have[f]}
    assert extra == {}, "the docs name views those files do not define"


def test_a_view_without_a_row_is_caught():
    doc = documented(DOC.read_text().replace(", `step_work_baseline`", ""))
    assert "step_work_baseline" not in doc["step/02_baseline.sql"]
    assert "step_work_baseline" in defined()["step/02_baseline.sql"]
