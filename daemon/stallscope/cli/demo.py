"""`stallscope demo`: a daemon, a serving engine (built-in, transformers or vLLM), the report.

Only the arguments live here; `demo.runner` does the work.
"""

from stallscope.cli.command import Command


def add_arguments(parser):
    parser.add_argument(
        "--engine",
        choices=["builtin", "transformers", "vllm"],
        default="builtin",
        help="builtin: the seed-shaped scenario engine; transformers: HF transformers' real "
        "continuous batching on a tiny random-weight Llama (needs the engines extra), "
        "traced by `stallscope run --preset transformers`; vllm: vLLM's CPU build, engine "
        "core and worker processes, with GC passes forced in the worker (needs the vllm "
        "extra), traced by `stallscope run --preset vllm` (default builtin)",
    )
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds (default 45; transformers 20)"
    )
    parser.add_argument("--db", default=None, help="keep the database here (default: a temp dir)")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="request arrivals per second (default 1; transformers 8)",
    )
    parser.add_argument(
        "--no-gc-pressure",
        dest="gc_pressure",
        action="store_false",
        help="run without the seed's leaky timing hook (no steady-state gen-2)",
    )
    parser.add_argument(
        "--ab",
        action="store_true",
        help="builtin engine: run it twice, as is and with gc.freeze() after warm-up, "
        "and print the comparison of the two arms",
    )
    parser.add_argument("--sched-backend", choices=["bcc", "perf", "proc", "none"])
    parser.add_argument("--out", default=None, help="where to write the report's PNG figures")


def run(args):
    from stallscope.demo import runner

    return runner.run_demo(args)


DEMO = Command(
    help="run a daemon, the built-in serving-engine scenario, and the attribution report",
    description="Start a daemon on a temporary socket and database, run the built-in "
    "serving engine (shaped like the seed report's), HF transformers' continuous batching "
    "or vLLM's CPU build under it, stop the daemon and print the summary and the "
    "attribution report.",
    add_arguments=add_arguments,
    run=run,
    examples=(
        "stallscope demo   # 45 s, then the report",
        "stallscope demo --engine vllm   # a real vLLM (engine core + worker), no source edit",
        "stallscope demo --ab --db ab.duckdb   # as is vs gc.freeze() after warm-up, kept",
    ),
)
