"""The environment that runs one checkout's code, for the A/B benchmarks.

A bench that compares trees (`--tree old=/tmp/base --tree new=.`) runs each
with its own `daemon/` first on PYTHONPATH: the trees share one .venv, whose
editable install points at one checkout. The views are data, not modules:
`stallscope.queries` resolves through that same editable install to the
venv's checkout whatever PYTHONPATH says, so without STALLSCOPE_QUERIES an
old tree would build its databases with the new tree's views.
"""

import os
from pathlib import Path


def tree_env(tree):
    """os.environ with `tree`'s code and views."""
    tree = Path(tree).resolve()
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{tree / 'daemon'}:{tree}"
    env["STALLSCOPE_QUERIES"] = str(tree / "queries")
    return env
