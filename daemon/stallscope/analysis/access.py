"""Read access to a stallscope database: from the file, or through the daemon.

DuckDB lets one process write a file and no other process open it while it
does. So readers open the file read-only when no daemon holds it, and ask the
running daemon (gRPC `Query` on its API socket) when one does. Both give the
same `query(sql) -> (columns, rows)`.
"""

import os
import re

import duckdb

from stallscope.analysis.coverage import STATUS_SQL as COVERAGE_STATUS_SQL
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


def _held_by_other_process(exc):
    text = str(exc)
    return "lock" in text.lower() or "Conflicting" in text


def api_socket_candidates(db_path, api_socket=None):
    """Where to look for the daemon holding `db_path`, best first: the socket
    the user named, the one the daemon published beside the database
    (service/endpoint.py), the configured default."""
    from stallscope.service.config import DEFAULT_API_SOCKET
    from stallscope.service.endpoint import published_socket

    found = [api_socket, published_socket(db_path), DEFAULT_API_SOCKET]
    out = []
    for sock in found:
        if sock and sock not in out:
            out.append(sock)
    return out


def open_for_reading(db_path, api_socket=None):
    """A FileSource, or an API source when a daemon holds the file. Without
    `api_socket`, the daemon's own published endpoint is used."""
    if not os.path.exists(db_path):
        raise AccessError(
            f"no database at {db_path} (is the daemon running with --db "
            f"{db_path}? set --db or $STALLSCOPE_DB)"
        )
    try:
        return FileSource(db_path)
    except AccessError as exc:
        if not _held_by_other_process(exc):
            raise
        candidates = api_socket_candidates(db_path, api_socket)
        for sock in candidates:
            if os.path.exists(sock):
                from stallscope.api.client import ApiSource

                return ApiSource(sock)
        raise AccessError(
            f"{db_path} is held by a running daemon and no API socket was found "
            f"(tried {', '.join(candidates)}): start the daemon with --api-socket, or "
            "point --api-socket at it"
        ) from None
