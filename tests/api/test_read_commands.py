"""Every read command works the same through a running daemon's API as on the
file, and finds the API by itself: the daemon publishes its socket beside the
database, so `--db` alone is enough while it runs (the API socket here is not
the default one). `report --out` draws its figures through the API too. The
daemon that served them never imported the report's own code (what lets
BENCHMARKS.md's daemon-wide rows leave it out of what they cover)."""

import gc
import os
import subprocess
import sys

import pytest

import probe_client
from helpers.api import start_api_daemon, stop
from helpers.waiting import wait_for
from stallscope.service.systemd.endpoint import endpoint_path

pytestmark = pytest.mark.daemon


def cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "stallscope.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def _engine_runs(socket_path):
    """Two runs: steps with stages and batches, and a GC pass inside a step."""
    for label in ("before", "after"):
        probe = probe_client.connect(socket_path=socket_path, run_label=label)
        for i in range(300):
            t0 = probe.begin()
            if i == 150:
                gc.collect()
            probe.end("step", t0, stage=("prefill", "decode")[i % 2], batch=1 + i % 4)
        probe.close()


# The daemon writes the names of the modules it imported when it exits.
MODULES = "daemon_modules.txt"
MODULES_AT_EXIT = """
import atexit, sys
def _modules_at_exit():
    with open({path!r}, "w") as f:
        f.write("\\n".join(sorted(sys.modules)))
atexit.register(_modules_at_exit)
"""
# The report's own code (what only `stallscope report` runs, in its process);
# bench/check.py's `covers` of the daemon-wide rows leave these out.
REPORT_ONLY = (
    "stallscope.analysis.report",
    "stallscope.analysis.oncpu",
    "stallscope.analysis.sections",
)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("read")
    d = start_api_daemon(path, preamble=MODULES_AT_EXIT.format(path=str(path / MODULES)))
    _engine_runs(d.socket)
    env = dict(os.environ)
    env.pop("STALLSCOPE_API_SOCKET", None)
    assert wait_for(
        lambda: "after" in cli("query", "SELECT label FROM runs", "--db", d.db, env=env).stdout
    )
    yield d, env, path
    stop(d)


# What the live tests saw, for the last test to compare with the file
# (pytest runs a module's tests in file order).
LIVE = {}


def _steady(text):
    """`text` without status's "Daemon footprint" section: the daemon samples
    itself every 10 s, so the latest sample live and after stop differ."""
    head, sep, rest = text.partition("## Daemon footprint")
    if not sep:
        return text
    return head + rest[rest.find("\n## ") + 1 :] if "\n## " in rest else head


COMMANDS = {
    "query": [
        "query",
        "SELECT label, count(*) FROM spans JOIN runs USING (run_id) GROUP BY 1 ORDER BY 1",
    ],
    "query_view": [
        "query",
        "SELECT * FROM step_attribution ORDER BY run_id, tid, step_idx",
        "--format",
        "csv",
    ],
    "status": ["status"],
    "compare": ["compare", "before", "after"],
    "compare_arms": ["compare", "--arm", "before", "--arm", "after"],
    "report": ["report"],
}


def test_endpoint_is_published_beside_the_database(served):
    d, _, _ = served
    with open(endpoint_path(d.db)) as f:
        assert d.api_socket in f.read()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_read_command_through_the_api_equals_the_file(served, name):
    d, env, path = served
    live = cli(*COMMANDS[name], "--db", d.db, env=env)
    assert live.returncode == 0, live.stderr
    assert live.stdout.strip()
    LIVE[name] = live.stdout


def test_report_figures_through_the_api(served):
    d, env, path = served
    out = path / "figures_live"
    live = cli("report", "--db", d.db, "--out", str(out), env=env)
    assert live.returncode == 0, live.stderr  # was: AttributeError ... fetchnumpy
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs, live.stdout
    LIVE["pngs"] = pngs


def test_after_stop_the_file_gives_the_same_answers(served):
    """Runs last in this module: stops the daemon and reads the file directly."""
    d, env, path = served
    live = LIVE
    assert set(COMMANDS) | {"pngs"} == set(live), "run the whole module"
    stop(d)
    assert not os.path.exists(endpoint_path(d.db))  # withdrawn at exit
    for name, args in COMMANDS.items():
        on_file = cli(*args, "--db", d.db, env=env)
        assert on_file.returncode == 0, on_file.stderr
        assert _steady(on_file.stdout) == _steady(live[name]), name
    out = path / "figures_file"
    on_file = cli("report", "--db", d.db, "--out", str(out), env=env)
    assert on_file.returncode == 0, on_file.stderr
    assert sorted(p.name for p in out.glob("*.png")) == live["pngs"]


def test_the_daemon_that_served_the_report_never_imported_its_code(served):
    """After the report went through the daemon's API (the tests above)."""
    d, _, path = served
    stop(d)
    modules = (path / MODULES).read_text().split()
    assert "stallscope.analysis.sandbox" in modules  # the list is the daemon's: it ran the SQL
    assert [m for m in modules if m.startswith(REPORT_ONLY)] == []
