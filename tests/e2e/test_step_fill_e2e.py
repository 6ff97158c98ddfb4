"""Acceptance: the daemon's step_components give the recomputing views' rows.

A real daemon with every kernel probe (`--deep`) traces two real engines at
once while it fills step_components as steps settle: `helpers/cause_engine.py`
(GIL waits with lock chains, preemption by a FIFO process, syscall and
page-fault bursts) and the scenario engine (GC passes over a large heap,
submit calls, blocking sleeps). After it stops, the database is opened
read-only, as `stallscope report --db` does, and every step view is read
twice: as shipped (stored rows for the filled steps, the rest computed)
and with the table switched off (every step computed from the source
tables). The rows must be equal, one for one.
"""

import os
import subprocess
import sys

import duckdb
import pytest

from helpers.daemonproc import DaemonProcess
from helpers.privileged import require_privileged
from stallscope.probes.bpf_common import bcc_unavailable

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

HERE = os.path.dirname(os.path.abspath(__file__))
CAUSE_ENGINE = os.path.join(os.path.dirname(HERE), "helpers", "cause_engine.py")
VIEWS = {
    "step_attribution": "run_id, tid, step_idx",
    "step_sched": "run_id, tid, step_idx",
    "step_gc": "run_id, tid, step_idx",
    "step_submit": "run_id, tid, step_idx",
}


@pytest.fixture(scope="module")
def traced_db(tmp_path_factory):
    reason = bcc_unavailable(["raw_syscalls:sys_enter", "exceptions:page_fault_user"])
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    tmp_path = tmp_path_factory.mktemp("fill-e2e")
    daemon = DaemonProcess(
        tmp_path,
        sched_backend="bcc",
        extra_args=["--deep", "--step-fill-interval-s", "1", "--step-fill-cpu-share", "1"],
    ).start()
    try:
        scenario = subprocess.Popen(
            [sys.executable, "-m", "stallscope.demo.scenario", daemon.socket,
             "--duration", "14", "--warmup", "1", "--rate", "2", "--heap-objects", "200000",
             "--label", "scenario", "--inject", "block,submit,gc", "--inject-every", "15",
             "--inject-ms", "10"],
            env=dict(os.environ, OPENBLAS_NUM_THREADS="1"),
        )  # fmt: skip
        subprocess.run(
            [sys.executable, CAUSE_ENGINE, daemon.socket,
             str(tmp_path / "injected.jsonl"), "3000", "10"],
            check=True, timeout=240,
        )  # fmt: skip
        assert scenario.wait(timeout=240) == 0
    finally:
        rc, _ = daemon.stop()
    assert rc == 0, daemon.read_log()
    return daemon.db


def test_filled_steps_are_most_of_the_run(traced_db):
    con = duckdb.connect(traced_db, read_only=True)
    steps = con.execute("SELECT count(*) FROM _step").fetchone()[0]
    filled = con.execute("SELECT count(*) FROM step_components").fetchone()[0]
    threads = con.execute("SELECT count(*) FROM step_component_threads").fetchone()[0]
    print(f"{filled} of {steps} steps filled by the daemon, {threads} threads")
    assert steps > 2000
    assert threads >= 2
    # the daemon stops ~2 s (the settle time) after the engines: the tail is
    # left to the views, the rest was filled while the engines ran
    assert filled >= steps // 2
    assert con.execute("SELECT count(*) FROM _step_todo").fetchone()[0] == steps - filled


@pytest.mark.parametrize("view", VIEWS)
def test_view_equals_the_recomputing_view(traced_db, view):
    con = duckdb.connect(traced_db, read_only=True)
    query = f"SELECT * FROM {view} ORDER BY {VIEWS[view]}"
    stored = con.execute(query).fetchall()
    con.execute("SET VARIABLE step_components_table = false")
    recomputed = con.execute(query).fetchall()
    assert len(stored) == len(recomputed) > 0
    for a, b in zip(stored, recomputed, strict=True):
        assert a == b
    if view == "step_attribution":
        causes = {
            r[0] for r in con.execute("SELECT DISTINCT cause FROM step_attribution").fetchall()
        }
        assert {"lock", "preemption", "gc"} <= causes, causes
