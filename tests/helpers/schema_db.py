"""A fresh database with this release's schema and views, fast.

`apply_schema` takes ~1 s here, almost all of it creating the views; the
query tests need hundreds of fresh databases, and the suite starts hundreds
of daemons. So the schema is applied once per test session into a template
file and each caller gets a copy of that file (~40 ms); a daemon opening a
copy finds its schema fingerprint current and has nothing to do
(store/migrations.py). Tests of schema creation itself keep calling
`apply_schema` on new files.
"""

import atexit
import itertools
import os
import shutil
import tempfile

import duckdb

from stallscope.store.migrations import apply_schema

_STATE = {"dir": None, "template": None}
_COUNTER = itertools.count()


def _template():
    if _STATE["template"] is None:
        folder = tempfile.mkdtemp(prefix="stallscope-schema-")
        atexit.register(shutil.rmtree, folder, True)
        path = os.path.join(folder, "template.duckdb")
        con = duckdb.connect(path)
        try:
            apply_schema(con)
            con.execute("CHECKPOINT")
        finally:
            con.close()
        _STATE.update(dir=folder, template=path)
    return _STATE["template"]


def copy_template(path):
    """Put a copy of the template database at `path` (a new file)."""
    shutil.copyfile(_template(), path)


def fresh_db():
    """A connection to a new database that holds the schema and the views."""
    template = _template()
    path = os.path.join(_STATE["dir"], f"db{next(_COUNTER)}.duckdb")
    shutil.copyfile(template, path)
    return duckdb.connect(path)
