"""The `export` command group: `perfetto`, `parquet`, `fleet`.

`perfetto` writes a trace file from a database (the file, or a running
daemon's Query API when it holds the file). `parquet` writes the fleet
export: from the file when no daemon holds it, else by asking the daemon
(the ExportParquet rpc: the daemon writes, into its own --export-dir only).
`fleet` runs SQL over an export directory in DuckDB, with the fleet views.
None of them writes to the database.
"""

import sys

from stallscope.cli.command import Command, add_db_arguments


def _perfetto_arguments(parser):
    parser.add_argument(
        "--run", type=int, action="append", default=None, help="only these runs (repeatable)"
    )
    parser.add_argument(
        "--from", dest="from_ns", type=int, default=None, help="from this CLOCK_MONOTONIC ns"
    )
    parser.add_argument(
        "--to", dest="to_ns", type=int, default=None, help="up to this CLOCK_MONOTONIC ns"
    )
    parser.add_argument("-o", "--output", required=True, help="trace file to write (.pftrace)")
    add_db_arguments(parser)


def run_perfetto(args):
    from stallscope.cli.source import open_for_reading
    from stallscope.export.perfetto import write_trace

    source = open_for_reading(args.db, args.api_socket)
    try:
        counts = write_trace(source, args.output, args.run, args.from_ns, args.to_ns)
    finally:
        source.close()
    shown = ", ".join(f"{k} {v}" for k, v in counts.items())
    print(f"wrote {args.output}: {shown} (open it at https://ui.perfetto.dev)")
    return 0


def _parquet_arguments(parser):
    parser.add_argument("dir", help="export directory (table=/host=/date= partitions)")
    parser.add_argument(
        "--host",
        default=None,
        help="host partition name (default: this machine's hostname; through a daemon: its "
        "export.host)",
    )
    add_db_arguments(parser)


def _held(exc):
    text = str(exc)
    return "lock" in text.lower() or "Conflicting" in text


def run_parquet(args):
    import os
    import socket

    import duckdb

    from stallscope.errors import AccessError
    from stallscope.export.parquet import export_parquet

    if not os.path.exists(args.db):
        raise AccessError(f"no database at {args.db} (set --db or $STALLSCOPE_DB)")
    try:
        con = duckdb.connect(args.db, read_only=True)
    except duckdb.Error as exc:
        if not _held(exc):
            raise AccessError(str(exc)) from None
        return _parquet_through_daemon(args)
    try:
        result = export_parquet(con, args.dir, args.host or socket.gethostname())
    finally:
        con.close()
    print(result.summary())
    return 0


def _parquet_through_daemon(args):
    import os

    from stallscope.api.client import Client
    from stallscope.cli.source import api_socket_candidates
    from stallscope.errors import AccessError, ApiError

    sockets = [s for s in api_socket_candidates(args.db, args.api_socket) if os.path.exists(s)]
    if not sockets:
        raise AccessError(
            f"{args.db} is held by a running daemon and no API socket was found: "
            "point --api-socket at it"
        )
    client = Client(sockets[0])
    try:
        reply = client.export_parquet(args.dir)
    finally:
        client.close()
    if args.host and args.host != reply.host:
        raise ApiError(
            f"the daemon exported as host {reply.host} (its export.host), not {args.host}"
        )
    rows = ", ".join(f"{t.table} {t.rows}" for t in reply.tables if t.rows) or "no new rows"
    print(
        f"exported host {reply.host} to {reply.dir} through the daemon: {rows}; "
        f"{reply.files} files; derived rows of {len(reply.runs_derived)} ended runs; "
        f"watermark {reply.watermark_ns}"
    )
    return 0


def _fleet_arguments(parser):
    parser.add_argument("dir", help="export directory written by `stallscope export parquet`")
    parser.add_argument(
        "sql", nargs="?", default="fleet_gen2", help="a view name or SQL (default fleet_gen2)"
    )
    parser.add_argument("--format", choices=["table", "csv", "json"], default="table")


def run_fleet(args):
    from stallscope.analysis import access, formatting
    from stallscope.errors import AccessError
    from stallscope.export.fleet import open_fleet

    con = open_fleet(args.dir)
    try:
        cur = con.execute(access.named_or_sql(args.sql))
        columns = [d[0] for d in cur.description] if cur.description else []
        rows = cur.fetchall()
    except Exception as exc:
        raise AccessError(str(exc).strip()) from None
    finally:
        con.close()
    sys.stdout.write(formatting.format_rows(columns, rows, args.format))
    return 0


_SUBCOMMANDS = {
    "perfetto": (
        "a Perfetto trace (steps, GC, off-CPU, migrations, GPU counters)",
        _perfetto_arguments,
        run_perfetto,
    ),
    "parquet": (
        "incremental Hive-partitioned Parquet for fleets (Spark, DuckDB, Trino)",
        _parquet_arguments,
        run_parquet,
    ),
    "fleet": (
        "query an export directory with the fleet views (DuckDB)",
        _fleet_arguments,
        run_fleet,
    ),
}


def _arguments(parser):
    sub = parser.add_subparsers(dest="export_command", metavar="FORMAT", required=True)
    for name, (help_text, add, _) in _SUBCOMMANDS.items():
        add(sub.add_parser(name, help=help_text, description=help_text))


def run(args):
    return _SUBCOMMANDS[args.export_command][2](args)


EXPORT = Command(
    help="export to the tools fleets use: Perfetto traces, Parquet for Spark",
    description="Export what the database holds to tools that read it: a Perfetto trace "
    "(ui.perfetto.dev) or an incremental Parquet dataset (table=/host=/date=) that Spark, "
    "Trino or DuckDB query across hosts; `fleet` asks such a dataset the seed questions "
    "(docs/export.md).",
    add_arguments=_arguments,
    run=run,
    examples=(
        "stallscope export perfetto --run 3 -o run3.pftrace   # one run, for ui.perfetto.dev",
        "stallscope export parquet /srv/fleet --host gpu-07   # only rows not exported before",
        "stallscope export fleet /srv/fleet fleet_slow_causes   # all hosts, DuckDB",
    ),
)
