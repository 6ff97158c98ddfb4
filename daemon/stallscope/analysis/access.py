"""Read access to a stallscope database file, and the read commands' SQL.

DuckDB lets one process write a file and no other process open it while it
does. `FileSource` opens the file read-only when no daemon holds it; the
API client's `ApiSource` asks the running daemon (gRPC `Query`) when one
does (`cli/source.py` picks). Both give the same `query(sql) -> (columns,
rows)`, so the report and the other readers never know which they have.
"""

import re

import duckdb

from stallscope.analysis.sections.coverage import STATUS_SQL as COVERAGE_STATUS_SQL
from stallscope.errors import AccessError

STATUS_QUERIES = (
    (
        "Runs",
        "SELECT run_id, pid, label, python, gc_threshold, freeze_count, connections, "
        "records, last_seq, ended_ns IS NULL AS live FROM runs ORDER BY run_id",
    ),
    (
        "Probes",
        "SELECT probe, backend, state, detail FROM probe_status "
        "QUALIFY row_number() OVER (PARTITION BY probe ORDER BY ts_ns DESC) = 1 "
        "ORDER BY probe",
    ),
    (
        "Known losses",
        "SELECT probe, reason, sum(count) AS records FROM losses GROUP BY ALL "
        "ORDER BY records DESC",
    ),
    (
        "Run events (attach specs: problems first, the latest 40)",
        "SELECT run_id, kind, target, message FROM run_events "
        "ORDER BY kind = 'attached', run_id DESC, ts_ns DESC LIMIT 40",
    ),
    (
        "Hangs (no step end while busy; the latest 10: stallscope query hang_dump_stacks)",
        "SELECT dump_id, run_id, pid, CASE WHEN recovered_ns IS NULL THEN 'HUNG or left' "
        "ELSE printf('recovered after %.1f s', (recovered_ns - last_step_end_ns) / 1e9) END "
        "AS state, threads, reason, lacks FROM hang_dumps ORDER BY detected_ns DESC LIMIT 10",
    ),
    (
        "Probe coverage (per run and probe, newest runs first)",
        COVERAGE_STATUS_SQL,
    ),
    (
        "Daemon footprint (latest sample; CPU % of one core since the previous one)",
        "SELECT pid, round(cpu_pct, 2) AS cpu_pct, round(rss_bytes / 1e6, 1) AS rss_mb, "
        "round(peak_rss_bytes / 1e6, 1) AS peak_rss_mb, cpus, "
        "coalesce(warning, 'no traced process shares its CPUs') AS placement "
        "FROM daemon_stats ORDER BY ts_ns DESC LIMIT 1",
    ),
    (
        "Rejected input",
        "SELECT reason, sum(count) AS count FROM ingest_errors GROUP BY ALL ORDER BY count DESC",
    ),
)

# Public tables and views (private helpers start with '_'), views first.
LIST_NAMES = (
    "SELECT table_name AS name, lower(table_type) AS kind FROM information_schema.tables "
    "WHERE table_schema = 'main' AND NOT starts_with(table_name, '_') "
    "ORDER BY table_type DESC, table_name"
)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def named_or_sql(text):
    """A bare view/table name becomes `SELECT * FROM name`; anything else is SQL."""
    text = text.strip().rstrip(";")
    if _NAME.match(text):
        return f'SELECT * FROM "{text}"'
    return text


class FileSource:
    def __init__(self, path):
        self.path = path
        try:
            self.con = duckdb.connect(path, read_only=True)
        except duckdb.IOException as exc:
            raise AccessError(str(exc)) from None

    def query(self, sql, params=None, limit=None):
        try:
            cur = self.con.execute(sql, params or [])
            columns = [d[0] for d in cur.description] if cur.description else []
            rows = cur.fetchmany(limit) if limit else cur.fetchall()
        except duckdb.Error as exc:
            raise AccessError(str(exc).strip()) from None
        return columns, rows

    def connection(self):
        return self.con

    def close(self):
        self.con.close()
