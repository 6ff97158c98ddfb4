"""The seed views over many hosts' Parquet exports, in DuckDB.

`open_fleet(dir)` returns an in-memory DuckDB connection over an export
directory (export/parquet.py's `table=/host=/date=` layout) holding:
- `fleet_<table>` for every exported table: all hosts' rows with a `host`
  column, the latest version of each changed row only (VERSION_KEYS);
- `fleet_<view>` for step_attribution and the seed views (seed_gen2,
  seed_runs, seed_slow_steps): each host's rows computed by the very views
  of queries/ over that host's exported tables, with `host` first;
- the fleet views of queries/fleet/ (fleet_gen2, fleet_slow_causes) over them.
Hosts are evaluated one at a time because every key of the views (run_id,
pid, tid, cpu, GPU index) and every CLOCK_MONOTONIC time is per host: two
hosts' run 1, or two hosts' steps at the same monotonic time, are unrelated.
Each host's tables are loaded into memory for its turn. Nothing here writes
to the export directory.
"""

import os
from pathlib import Path

import duckdb

from stallscope.errors import StallscopeError
from stallscope.export.parquet import DERIVED_VIEWS, VERSION_KEYS, arrow_reader
from stallscope.store import views
from stallscope.store.database import STORED_TABLES
from stallscope.store.migrations import SCHEMA_DIR


class FleetError(StallscopeError):
    heading = "fleet"


def _glob(out_dir, table, host="*"):
    return os.path.join(out_dir, f"table={table}", f"host={host}", "date=*", "*.parquet")


def _has_files(out_dir, table, host="*"):
    import glob

    return bool(glob.glob(_glob(out_dir, table, host)))


def hosts(out_dir):
    """Host names with at least one exported file, sorted."""
    found = set()
    for table_dir in Path(out_dir).glob("table=*"):
        for host_dir in table_dir.glob("host=*"):
            found.add(host_dir.name.split("=", 1)[1])
    return sorted(found)


def _source(out_dir, table, host="*"):
    """SELECT over a table's files: partition columns (but host) dropped, the
    latest version of each row of a changing table."""
    scan = (
        f'SELECT * EXCLUDE ("table", "date") FROM read_parquet(\'{_glob(out_dir, table, host)}\', '
        "hive_partitioning = true, union_by_name = true, hive_types = {'host': VARCHAR})"
    )
    key = VERSION_KEYS.get(table)
    if key:
        cols = ", ".join(["host", *key])
        scan += f" QUALIFY row_number() OVER (PARTITION BY {cols} ORDER BY stored_ns DESC) = 1"
    return scan


def _host_connection(out_dir, host):
    """A connection holding one host's exported tables under their own names
    (empty where nothing was exported), with the views of queries/."""
    con = duckdb.connect(":memory:")
    for path in sorted(SCHEMA_DIR.glob("*.sql")):
        con.execute(path.read_text())
    for table in STORED_TABLES:
        if _has_files(out_dir, table, host):
            con.execute(
                f'INSERT INTO "{table}" BY NAME SELECT * EXCLUDE (host) '
                f"FROM ({_source(out_dir, table, host)})"
            )
    # runs.host is not exported (the partition replaces it): give it back.
    con.execute("UPDATE runs SET host = ?", [host])
    failures = views.create_views(con)
    if failures:
        raise FleetError(f"views failed over host {host}'s export: {failures[0][1]}")
    return con


def open_fleet(out_dir):
    """The fleet connection described above; FleetError when `out_dir` holds
    no export."""
    out_dir = os.path.abspath(out_dir)
    found = hosts(out_dir)
    if not found:
        raise FleetError(f"no export under {out_dir} (run `stallscope export parquet` first)")
    fleet = duckdb.connect(":memory:")
    for table in STORED_TABLES:
        if _has_files(out_dir, table):
            fleet.execute(f'CREATE VIEW "fleet_{table}" AS {_source(out_dir, table)}')
    for host in found:
        con = _host_connection(out_dir, host)
        try:
            for view in DERIVED_VIEWS:
                data = arrow_reader(con, f'SELECT ? AS host, * FROM "{view}"', [host]).read_all()
                fleet.register("_part", data)
                exists = fleet.execute(
                    "SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [f"fleet_{view}"]
                ).fetchall()[0][0]
                if exists:
                    fleet.execute(f'INSERT INTO "fleet_{view}" BY NAME SELECT * FROM _part')
                else:
                    fleet.execute(f'CREATE TABLE "fleet_{view}" AS SELECT * FROM _part')
                fleet.unregister("_part")
        finally:
            con.close()
    failures = views.create_views(fleet, views.fleet_query_files())
    if failures:
        raise FleetError(f"fleet view file {failures[0][0]} failed: {failures[0][1]}")
    return fleet
