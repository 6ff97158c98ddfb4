"""Acceptance: summarising threads without spans changes no step's attribution.

The views read the kernel rows of step threads only: a step thread's
preemptor and waker are named from its own switch-out and wake-up (their
tgid from the kernel's thread map, which keeps summarised threads), not
from the sibling's rows. So `helpers/cause_engine.py` is traced with every thread
exact (`--sched-detail`, every kernel probe on), step_attribution is read,
then every offcpu, runq and migrations row of the threads that never emitted
a span (the GIL-holding sibling, the probe's own thread) is deleted, as
summarising leaves them, and step_attribution must come back the same, row
for row, still naming the sibling as the waker of the steps it held. The
live side (the sibling summarised while the views still name it) is
test_kernel_causes_views_e2e.py, which runs with the default settings.
"""

import os
import shutil
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
STEPS, EVERY = 400, 10  # about 10 injections of each cause

ATTRIBUTION = "SELECT * FROM step_attribution ORDER BY run_id, tid, step_idx"
NO_SPANS = (
    "(pid, tid) NOT IN (SELECT DISTINCT r.pid, s.tid FROM spans s JOIN runs r USING (run_id))"
)


@pytest.fixture(scope="module")
def detailed(tmp_path_factory):
    reason = bcc_unavailable(["raw_syscalls:sys_enter", "exceptions:page_fault_user"])
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    tmp_path = tmp_path_factory.mktemp("summary-e2e")
    daemon = DaemonProcess(
        tmp_path, sched_backend="bcc", extra_args=["--deep", "--sched-detail"]
    ).start()
    log = tmp_path / "injected.jsonl"
    try:
        subprocess.run(
            [sys.executable, CAUSE_ENGINE, daemon.socket, str(log),
             str(STEPS), str(EVERY)],
            check=True, timeout=240,
        )  # fmt: skip
    finally:
        rc, _ = daemon.stop()
    assert rc == 0
    return daemon, tmp_path


def test_views_need_no_rows_of_threads_without_spans(detailed):
    daemon, tmp_path = detailed
    copy = tmp_path / "stripped.duckdb"
    shutil.copy(daemon.db, copy)
    con = duckdb.connect(str(copy))
    try:
        before = con.execute(ATTRIBUTION).fetchall()
        stripped = 0
        for table in ("offcpu", "runq", "migrations"):
            stripped += con.execute(f"SELECT count(*) FROM {table} WHERE {NO_SPANS}").fetchone()[0]
            con.execute(f"DELETE FROM {table} WHERE {NO_SPANS}")
        after = con.execute(ATTRIBUTION).fetchall()
        wakers = con.execute(
            "SELECT count(*) FROM step_attribution WHERE waker_comm = 'stall-gil'"
        ).fetchone()[0]
        columns = [d[0] for d in con.description] if con.description else []
    finally:
        con.close()
    assert stripped > 100  # the sibling and the probe's thread had rows to lose
    assert len(before) >= STEPS and after == before, columns
    assert wakers >= 5  # the sibling is still named, from the step thread's own rows
