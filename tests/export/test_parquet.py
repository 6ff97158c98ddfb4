"""`stallscope export parquet` on real traced runs: complete, incremental across
daemon restarts, late rows, idempotent, all-or-nothing per file, and the same
through a running daemon as from the file. The fleet views over the export
give the answers the hosts' own databases give."""

import glob
import os
import shutil
import subprocess
import sys

import duckdb
import pyarrow.parquet as pq
import pytest

from export.conftest import HOSTS, run_engine, traced_database
from helpers.daemonproc import DaemonProcess
from helpers.waiting import wait_for
from stallscope.export import parquet as export_parquet_module
from stallscope.export.fleet import open_fleet
from stallscope.export.parquet import ExportError, export_parquet, load_state
from stallscope.store.database import STORED_TABLES, Store

pytestmark = pytest.mark.daemon

CHECKED = ("runs", "spans", "gc_events", "probe_status", "losses", "coverage")


def export_file(db, out_dir, host):
    con = duckdb.connect(db, read_only=True)
    try:
        return export_parquet(con, out_dir, host)
    finally:
        con.close()


def parquet_files(out_dir):
    return sorted(glob.glob(os.path.join(out_dir, "table=*", "host=*", "date=*", "*.parquet")))


def exported(out_dir, table, host, latest=False):
    """Rows of `table` exported for `host` (latest version per run for runs)."""
    files = glob.glob(os.path.join(out_dir, f"table={table}", f"host={host}", "*", "*.parquet"))
    if not files:
        return []
    con = duckdb.connect()
    sql = f'SELECT * EXCLUDE (host, date, "table") FROM read_parquet({files!r}, hive_partitioning = true, union_by_name = true)'
    if latest:
        sql += " QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY stored_ns DESC) = 1"
    return con.execute(sql).fetchall()


def db_count(db, table):
    con = duckdb.connect(db, read_only=True)
    try:
        return con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
    finally:
        con.close()


def test_export_holds_every_row_and_the_fleet_views_agree(fleet_dbs, tmp_path):
    out = str(tmp_path / "fleet")
    for host, daemon in fleet_dbs.items():
        result = export_file(daemon.db, out, host)
        assert result.rows["spans"] == db_count(daemon.db, "spans") > 0
        assert result.runs_derived == [1]
    for host, daemon in fleet_dbs.items():
        for table in CHECKED:
            assert len(exported(out, table, host, latest=table == "runs")) == db_count(
                daemon.db, table
            ), (host, table)
        assert len(exported(out, "step_attribution", host)) == db_count(
            daemon.db, "step_attribution"
        )
    # Hive layout, readable files, no temporary file left, no host column clash
    files = parquet_files(out)
    assert files and not glob.glob(os.path.join(out, "**", ".*tmp*"), recursive=True)
    for path in files:
        assert "host" not in pq.read_schema(path).names
    fleet = open_fleet(out)
    gen2 = {
        r[0]: r[1:]
        for r in fleet.execute("SELECT host, gen2_passes, gen2_stalls FROM fleet_gen2").fetchall()
    }
    causes = set(fleet.execute("SELECT host, cause, slow_steps FROM fleet_slow_causes").fetchall())
    for host, daemon in fleet_dbs.items():
        passes, stalls = daemon.query("SELECT count(*), count(*) FILTER (stall) FROM seed_gen2")[0]
        assert gen2[host] == (passes, stalls)
        assert passes == HOSTS[host][0] // HOSTS[host][1]
        want = {
            (host, cause, n)
            for cause, n in daemon.query(
                "SELECT cause, count(*) FROM step_attribution WHERE slow GROUP BY cause"
            )
        }
        assert {c for c in causes if c[0] == host} == want


def test_export_is_incremental_across_restarts_and_takes_late_rows(tmp_path):
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    daemon = traced_database(host_dir, "first", (300, 50, 0))
    out = str(tmp_path / "out")
    first = export_file(daemon.db, out, "h1")
    files = {p: os.stat(p).st_mtime_ns for p in parquet_files(out)}
    # idempotent: nothing new, no file touched
    again = export_file(daemon.db, out, "h1")
    assert sum(again.rows.values()) == 0 and again.files == 0
    assert {p: os.stat(p).st_mtime_ns for p in parquet_files(out)} == files
    # the daemon restarts (a new process: its monotonic clock would not help)
    # and stores a second run
    daemon.start()
    try:
        run_engine(daemon.socket, "second", 200, 0, 0)
    finally:
        assert daemon.stop()[0] == 0
    second = export_file(daemon.db, out, "h1")
    assert second.rows["spans"] == 400  # the second run's steps and submits only
    assert second.watermark_ns > first.watermark_ns
    assert second.runs_derived == [2]
    # a late row: an old GC pass (start before every exported one) stored now
    store = Store(daemon.db)
    store.append(
        "gc_events",
        {
            "run_id": [1],
            "tid": [1],
            "generation": [2],
            "start_ns": [5],
            "end_ns": [6],
            "collected": [0],
            "uncollectable": [0],
            "seq": [0],
        },
    )
    store.close()
    late = export_file(daemon.db, out, "h1")
    assert late.rows["gc_events"] == 1
    rows = exported(out, "gc_events", "h1")
    assert len(rows) == db_count(daemon.db, "gc_events") == 300 // 50 + 1
    assert len(exported(out, "spans", "h1")) == db_count(daemon.db, "spans") == 1000
    assert len(exported(out, "runs", "h1", latest=True)) == 2
    # both runs' derived rows in one export: one file per run and view
    fresh = export_file(daemon.db, str(tmp_path / "fresh"), "h2")
    assert fresh.runs_derived == [1, 2]
    per_run = glob.glob(str(tmp_path / "fresh" / "table=step_attribution" / "*" / "*" / "*"))
    assert sorted(os.path.basename(p) for p in per_run) == [
        "run-000000000001.parquet",
        "run-000000000002.parquet",
    ]
    assert len(exported(str(tmp_path / "fresh"), "step_attribution", "h2")) == 500
    assert {r[0] for r in exported(str(tmp_path / "fresh"), "seed_runs", "h2")} == {1, 2}
    state = load_state(out, "h1")
    assert set(state["tables"]) == set(STORED_TABLES)
    assert state["derived_runs"] == {
        "1": daemon.scalar("SELECT stored_ns FROM runs WHERE run_id = 1"),
        "2": daemon.scalar("SELECT stored_ns FROM runs WHERE run_id = 2"),
    }


def test_interrupted_export_leaves_no_partial_file_and_is_redone(fleet_dbs, tmp_path, monkeypatch):
    db = fleet_dbs["gpu-a"].db
    out = str(tmp_path / "out")
    real = export_parquet_module._write_atomically
    calls = []

    def fail_in_the_third_file(path, batches, schema):
        calls.append(path)
        if len(calls) == 3:
            # a crash in the middle of writing: the batches are half read
            next(iter(batches), None)
            raise OSError(28, "No space left on device")
        return real(path, batches, schema)

    monkeypatch.setattr(export_parquet_module, "_write_atomically", fail_in_the_third_file)
    with pytest.raises(OSError):
        export_file(db, out, "gpu-a")
    assert not glob.glob(os.path.join(out, "**", ".*"), recursive=True)
    assert not os.path.exists(os.path.join(out, "_stallscope", "state-gpu-a.json"))
    for path in parquet_files(out):
        pq.read_table(path)  # every visible file is whole
    monkeypatch.setattr(export_parquet_module, "_write_atomically", real)
    export_file(db, out, "gpu-a")
    for table in CHECKED:
        assert len(exported(out, table, "gpu-a", latest=table == "runs")) == db_count(db, table)


def test_bad_destination_and_host_are_refused(fleet_dbs, tmp_path):
    with pytest.raises(ExportError, match="host name"):
        export_file(fleet_dbs["gpu-a"].db, str(tmp_path / "o"), "a/b")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ExportError, match="cannot create"):
        export_file(fleet_dbs["gpu-a"].db, str(blocker / "sub"), "h")


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "stallscope.cli", "export", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_through_a_running_daemon_then_from_the_file(tmp_path):
    out = tmp_path / "exports"
    api = str(tmp_path / "api.sock")
    daemon = DaemonProcess(
        tmp_path,
        extra_args=["--api-socket", api, "--export-dir", str(out), "--export-host", "live-1"],
    ).start()
    try:
        run_engine(daemon.socket, "live", 300, 60, 0)
        # the daemon holds the file: the CLI asks it to export (again until
        # the daemon's writer has stored the run's rows)
        replies = []

        def exported_some():
            replies.append(cli("parquet", "--db", daemon.db, str(out)))
            assert replies[-1].returncode == 0, replies[-1].stderr
            return len(exported(str(out), "spans", "live-1")) > 0

        assert wait_for(exported_some, timeout_s=60, interval_s=0.5)
        assert "through the daemon" in replies[-1].stdout
        assert "host live-1" in replies[-1].stdout
        # it writes nowhere else
        other = cli("parquet", "--db", daemon.db, str(tmp_path / "elsewhere"))
        assert other.returncode == 2
        assert "exports to" in other.stderr and not (tmp_path / "elsewhere").exists()
    finally:
        assert daemon.stop()[0] == 0
    # the same directory from the file: continues from the daemon's watermark
    done = cli("parquet", "--db", daemon.db, "--host", "live-1", str(out))
    assert done.returncode == 0, done.stderr
    assert len(exported(str(out), "spans", "live-1")) == db_count(daemon.db, "spans") == 600
    assert len(exported(str(out), "gc_events", "live-1")) == db_count(daemon.db, "gc_events") == 5


def test_daemon_exports_after_each_retention_check(tmp_path):
    out = tmp_path / "timer"
    daemon = DaemonProcess(
        tmp_path,
        extra_args=[
            "--export-dir",
            str(out),
            "--export-after-retention",
            "--retention-interval-s",
            "1",
            "--export-host",
            "timer",
        ],
    ).start()
    try:
        run_engine(daemon.socket, "t", 200, 0, 0)
        assert wait_for(lambda: len(exported(str(out), "spans", "timer")) == 400, timeout_s=60)
    finally:
        assert daemon.stop()[0] == 0
    (tmp_path / "refused").mkdir()
    refused = DaemonProcess(tmp_path / "refused", extra_args=["--export-after-retention"])
    refused.start(wait=False)
    assert refused.proc.wait(timeout=60) == 2
    assert "export.after_retention needs export.parquet_dir" in refused.read_log()
    shutil.rmtree(out)
