"""A database written by the previous release (schema 0.1.0, kept verbatim in
fixtures/) opens in this one with every row intact, gains this release's
tables and columns, records its schema version, and is then read by a real
daemon; a database from a newer release is refused before anything is written."""

import shutil
from pathlib import Path

import duckdb
import pytest

import probe_client
from helpers.daemonproc import DaemonProcess
from stallscope.errors import SchemaVersionError
from stallscope.store import migrations
from stallscope.store.database import Store

pytestmark = pytest.mark.daemon

OLD_SCHEMA = Path(__file__).parent / "fixtures" / "schema_0.1.0"


def make_old_database(path):
    """What the 0.1.0 daemon left behind: its tables, a run, spans, GC, offcpu."""
    con = duckdb.connect(str(path))
    for sql in sorted(OLD_SCHEMA.glob("*.sql")):
        con.execute(sql.read_text())
    con.execute(
        "INSERT INTO runs (run_id, pid, label, started_ns, records) VALUES (1, 4242, 'old', 100, 3)"
    )
    con.execute(
        "INSERT INTO spans VALUES (1, 7, 'step', 'coda', 4, 1000, 2000, 0, 1),"
        " (1, 7, 'step', 'coda', 4, 3000, 9000, 0, 2)"
    )
    con.execute("INSERT INTO gc_events VALUES (1, 7, 2, 3500, 8500, 10, 0, 3)")
    con.execute(
        "INSERT INTO offcpu (pid, tid, start_ns, end_ns, preempted, cpu) VALUES (4242, 7, 3100, 3200, true, 0)"
    )
    con.execute("CHECKPOINT")
    con.close()


def columns(con, table):
    return {r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()}


def test_old_database_is_migrated_in_place_with_rows_intact(tmp_path):
    db = tmp_path / "old.duckdb"
    make_old_database(db)
    store = Store(str(db))
    try:
        con = store.cursor()
        assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == 2
        assert con.execute("SELECT generation, collected FROM gc_events").fetchall() == [(2, 10)]
        assert {"work", "idle"} <= columns(con, "spans")
        assert {"preemptor_pid", "waker_tid", "wakeup_ns"} <= columns(con, "offcpu")
        for table in ("syscalls", "page_faults", "irq_time", "steal", "coverage"):
            assert con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0
        versions = con.execute(
            "SELECT version, name FROM schema_version ORDER BY version"
        ).fetchall()
        assert versions[0] == (0, "base")
        assert versions[-1][0] == migrations.SCHEMA_VERSION
        # Old rows read through the new views: the new columns are NULL, not made up.
        assert (
            con.execute(
                "SELECT count(*) FROM spans WHERE work IS NULL AND idle IS NULL"
            ).fetchone()[0]
            == 2
        )
        assert con.execute("SELECT count(*) FROM step_attribution").fetchone()[0] == 2
    finally:
        store.close()
    # Opening again applies nothing twice.
    store = Store(str(db))
    try:
        n = store.cursor().execute("SELECT count(*) FROM schema_version").fetchone()[0]
        assert n == len(versions)
    finally:
        store.close()


def test_new_database_records_the_current_version(tmp_path):
    store = Store(str(tmp_path / "new.duckdb"))
    try:
        rows = store.cursor().execute("SELECT version, name FROM schema_version").fetchall()
        assert rows == [(migrations.SCHEMA_VERSION, "base")]
    finally:
        store.close()


def test_database_from_a_newer_release_is_refused_untouched(tmp_path):
    db = tmp_path / "future.duckdb"
    store = Store(str(db))
    store.cursor().execute(
        "INSERT INTO schema_version VALUES (?, 0, '999_future.sql')",
        [migrations.SCHEMA_VERSION + 1],
    )
    store.close()
    before = db.read_bytes()
    with pytest.raises(SchemaVersionError, match="newer stallscope"):
        Store(str(db))
    con = duckdb.connect(str(db), read_only=True)
    assert (
        con.execute("SELECT max(version) FROM schema_version").fetchone()[0]
        == migrations.SCHEMA_VERSION + 1
    )
    con.close()
    assert len(db.read_bytes()) == len(before)


def test_daemon_opens_an_old_database_and_adds_new_runs(tmp_path):
    db = tmp_path / "old.duckdb"
    make_old_database(db)
    d = DaemonProcess(tmp_path)
    d.db = str(db)
    d.start()
    try:
        probe = probe_client.connect(socket_path=d.socket, gc=False, run_label="new")
        for _ in range(100):
            probe.end("step", probe.begin(), stage="coda", batch=4)
        probe.close()  # sent before the SIGTERM below: the daemon drains it
    finally:
        rc = d.stop()
    assert rc[0] == 0
    con = duckdb.connect(str(db), read_only=True)
    try:
        labels = dict(con.execute("SELECT label, count(*) FROM runs GROUP BY label").fetchall())
        assert labels == {"old": 1, "new": 1}
        n_new = con.execute(
            "SELECT count(*) FROM spans JOIN runs USING (run_id) WHERE label = 'new'"
        ).fetchone()[0]
        assert n_new == 100
        assert (
            con.execute(
                "SELECT count(*) FROM spans JOIN runs USING (run_id) WHERE label = 'old'"
            ).fetchone()[0]
            == 2
        )
    finally:
        con.close()


def test_stored_tables_are_the_tables_with_a_stored_ns_column(tmp_path):
    """STORED_TABLES is read from the schema files: it equals what a fresh
    database has, and a new table with the column joins it."""
    from helpers.schema_db import fresh_db
    from stallscope.store.database import STORED_TABLES

    con = fresh_db()
    having = {
        r[0]
        for r in con.execute(
            "SELECT table_name FROM information_schema.columns WHERE column_name = 'stored_ns'"
        ).fetchall()
    }
    assert set(STORED_TABLES) == having and len(STORED_TABLES) == len(having) >= 20
    assert STORED_TABLES[0] == "runs"
    (tmp_path / "010_a.sql").write_text(
        "CREATE TABLE IF NOT EXISTS widgets (\n    id BIGINT,\n    stored_ns BIGINT\n);\n"
        "CREATE TABLE IF NOT EXISTS plain (\n    id BIGINT\n);\n"
    )
    (tmp_path / "020_b.sql").write_text(
        "-- ALTER TABLE commented ADD COLUMN stored_ns BIGINT;\n"
        "ALTER TABLE plain ADD COLUMN IF NOT EXISTS stored_ns BIGINT DEFAULT 1;\n"
    )
    assert migrations.stored_tables(tmp_path) == ("widgets", "plain")


def test_a_current_file_is_opened_without_rebuilding_its_views(tmp_path, monkeypatch):
    """Building the views costs ~0.7 s per open: a file whose fingerprint
    (schema, migration and view files, DuckDB version) is current, and that
    still has every view and macro, is left alone; a changed view file, or a
    view dropped since, makes the next open rebuild them."""
    path = str(tmp_path / "f.duckdb")
    con = duckdb.connect(path)
    migrations.apply_schema(con)
    ran = []
    real = migrations.views.create_views
    monkeypatch.setattr(
        migrations.views, "create_views", lambda c, files=None: ran.append(1) or real(c, files)
    )
    migrations.apply_schema(con)
    assert ran == []  # current: nothing to do
    con.execute("DROP VIEW step_attribution")
    migrations.apply_schema(con)
    assert ran == [1]  # a view was missing: rebuilt
    assert con.execute("SELECT count(*) FROM step_attribution").fetchone()[0] == 0
    queries = tmp_path / "queries"
    shutil.copytree(migrations.views.queries_dir(), queries)
    extra = queries / "step" / "99_extra.sql"
    extra.write_text("CREATE OR REPLACE VIEW step_extra AS SELECT 1 AS one;\n")
    monkeypatch.setenv("STALLSCOPE_QUERIES", str(queries))
    migrations.apply_schema(con)
    assert ran == [1, 1]  # the view files changed: rebuilt
    assert con.execute("SELECT one FROM step_extra").fetchone()[0] == 1
    con.close()
