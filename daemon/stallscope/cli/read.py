"""The read-side commands: `query`, `report`, `compare`, `status`.

Each reads a database file directly when no daemon holds it, or through a
running daemon's API when one does (DuckDB allows one writer process;
`cli/source.py` picks). They never write to the database.
"""

import sys

from stallscope.cli.command import Command, add_db_arguments


def _open_readonly(args):
    from stallscope.cli.source import open_for_reading

    return open_for_reading(args.db, args.api_socket)


# ----- query ---------------------------------------------------------------------
def _query_arguments(parser):
    parser.add_argument("sql", nargs="?", help="a view name (see --list) or a SQL query")
    parser.add_argument("--list", action="store_true", help="list the named queries and tables")
    parser.add_argument("--format", choices=["table", "csv", "json"], default="table")
    parser.add_argument("--limit", type=int, default=None, help="at most this many rows")
    add_db_arguments(parser)


def run_query(args):
    from stallscope.analysis import access, formatting
    from stallscope.errors import AccessError

    if args.list:
        sql = access.LIST_NAMES
    elif args.sql:
        sql = access.named_or_sql(args.sql)
    else:
        raise AccessError("give a view name or SQL (or --list to see the names)")
    source = _open_readonly(args)
    try:
        columns, rows = source.query(sql, limit=args.limit)
    finally:
        source.close()
    sys.stdout.write(formatting.format_rows(columns, rows, args.format))
    return 0


QUERY = Command(
    help="run a named query (a view) or SQL",
    add_arguments=_query_arguments,
    run=run_query,
    examples=(
        "stallscope query --list   # the views and tables",
        "stallscope query step_attribution --format csv   # one view, as CSV",
        'stallscope query "SELECT cause, count(*) FROM step_attribution GROUP BY cause"',
    ),
)


# ----- report ----------------------------------------------------------------------
def _report_arguments(parser):
    parser.add_argument(
        "--run", type=int, action="append", default=None, help="only these runs (repeatable)"
    )
    parser.add_argument("--out", default=None, help="directory for PNG figures")
    add_db_arguments(parser)


def run_report(args):
    from stallscope.analysis import report

    source = _open_readonly(args)
    try:
        print(report.build_report(source.connection(), out_dir=args.out, run_ids=args.run))
    finally:
        source.close()
    return 0


REPORT = Command(
    help="the attribution report: text tables and PNG figures",
    add_arguments=_report_arguments,
    run=run_report,
    examples=(
        "stallscope report   # every run in the service's database",
        "stallscope report --run 3 --out /tmp/figures   # one run, with figures",
    ),
)


# ----- compare ---------------------------------------------------------------------
def _compare_arguments(parser):
    parser.add_argument("run_a", nargs="?", help="run id or label")
    parser.add_argument("run_b", nargs="?", help="run id or label")
    parser.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="RUNS",
        help="one arm of an A/B test: run ids or labels, comma-separated (a label names all "
        "its runs); repeat for each arm, instead of RUN_A RUN_B",
    )
    add_db_arguments(parser)


def run_compare(args):
    from stallscope.analysis import compare, compare_arms
    from stallscope.errors import AccessError

    if args.arm and (args.run_a or args.run_b):
        raise AccessError("give either RUN_A RUN_B or --arm A --arm B, not both")
    if len(args.arm) == 1 or not (args.arm or (args.run_a and args.run_b)):
        raise AccessError("give two runs (RUN_A RUN_B) or two arms (--arm A --arm B)")
    source = _open_readonly(args)
    try:
        con = source.connection()
        if args.arm:
            print(compare_arms.compare_arms(con, args.arm))
        else:
            print(compare.compare_runs(con, args.run_a, args.run_b))
    finally:
        source.close()
    return 0


COMPARE = Command(
    help="compare two runs side by side",
    add_arguments=_compare_arguments,
    run=run_compare,
    examples=(
        "stallscope compare before freeze   # two runs by label",
        "stallscope compare 1 2 --db /tmp/s.duckdb   # by run_id, another database",
        "stallscope compare --arm asis --arm frozen   # A/B arms: labels or ids (1,3,5)",
    ),
)


# ----- status ----------------------------------------------------------------------
def run_status(args):
    from stallscope.analysis import access, formatting

    source = _open_readonly(args)
    try:
        for title, sql in access.STATUS_QUERIES:
            columns, rows = source.query(sql)
            print(f"## {title}")
            sys.stdout.write(formatting.format_rows(columns, rows, "table"))
            print()
    finally:
        source.close()
    return 0


STATUS = Command(
    help="what the daemon holds: runs, probes, losses",
    add_arguments=add_db_arguments,
    run=run_status,
    examples=(
        "stallscope status   # the service's database (through its API while it runs)",
        "stallscope status --db /tmp/s.duckdb",
    ),
)
