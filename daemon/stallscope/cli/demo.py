"""`stallscope demo`: a daemon, the built-in serving engine, the report.

Only the arguments live here; `demo.runner` does the work.
"""

from stallscope.cli.command import Command


def add_arguments(parser):
    parser.add_argument(
        "--duration", type=float, default=45.0, help="scenario seconds (default 45)"
    )
    parser.add_argument("--db", default=None, help="keep the database here (default: a temp dir)")
    parser.add_argument("--rate", type=float, default=1.0, help="request arrivals per second")
    parser.add_argument(
        "--no-gc-pressure",
        dest="gc_pressure",
        action="store_false",
        help="run without the seed's leaky timing hook (no steady-state gen-2)",
    )
    parser.add_argument("--sched-backend", choices=["bcc", "perf", "proc", "none"])
    parser.add_argument("--out", default=None, help="where to write the report's PNG figures")


def run(args):
    from stallscope.demo import runner

    return runner.run_demo(args)


DEMO = Command(
    help="run a daemon, the built-in serving-engine scenario, and the attribution report",
    description="Start a daemon on a temporary socket and database, run the built-in "
    "serving engine (shaped like the seed report's) under it, stop the daemon and print "
    "the summary and the attribution report.",
    add_arguments=add_arguments,
    run=run,
    examples=(
        "stallscope demo   # 45 s, then the report",
        "stallscope demo --duration 10 --db demo.duckdb --out figures/   # keep what it made",
        "stallscope demo --no-gc-pressure   # the same engine without the leaky timing hook",
    ),
)
