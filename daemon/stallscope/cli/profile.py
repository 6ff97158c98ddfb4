"""The `profile` command: where the CPU time of traced threads went, from the CPU sampler.

It reads the database (the file, or a running daemon's Query API when it
holds the file) through `analysis.profile` and prints top frames (self and
total) and the hottest stacks, or, with --collapsed, every stack in the
format flame-graph tools read. It only parses and prints; it never writes.
"""

import sys

from stallscope.cli.command import Command, add_db_arguments


def _arguments(parser):
    parser.add_argument("--run", type=int, default=None, help="only this run's process")
    parser.add_argument(
        "--from", dest="from_ns", type=int, default=None, help="from this CLOCK_MONOTONIC ns"
    )
    parser.add_argument(
        "--to", dest="to_ns", type=int, default=None, help="up to this CLOCK_MONOTONIC ns"
    )
    parser.add_argument(
        "--stage", default=None, help="only samples inside steps of this stage (e.g. prefill)"
    )
    parser.add_argument(
        "--slow", action="store_true", help="only samples inside slow steps (step_attribution)"
    )
    parser.add_argument(
        "--collapsed",
        action="store_true",
        help="print `root;...;leaf count` lines only (flamegraph.pl, speedscope, inferno)",
    )
    parser.add_argument("--limit", type=int, default=20, help="rows per top-frames table")
    add_db_arguments(parser)


def run_profile(args):
    from stallscope.analysis import profile
    from stallscope.cli.source import open_for_reading

    source = open_for_reading(args.db, args.api_socket)
    try:
        prof = profile.profile(
            source,
            run_id=args.run,
            from_ns=args.from_ns,
            to_ns=args.to_ns,
            stage=args.stage,
            slow=args.slow,
            limit=args.limit,
        )
    finally:
        source.close()
    if args.collapsed:
        sys.stdout.write(profile.format_collapsed(prof))
        return 0
    what = [f"run {args.run}" if args.run is not None else "every traced process"]
    if args.stage is not None:
        what.append(f"steps of stage {args.stage!r}")
    if args.slow:
        what.append("slow steps")
    if args.from_ns is not None or args.to_ns is not None:
        what.append(f"ns [{args.from_ns or '-inf'}, {args.to_ns or 'inf'})")
    sys.stdout.write(profile.format_profile(prof, ", ".join(what)))
    return 0


PROFILE = Command(
    help="CPU profile of traced threads: top frames and stacks (the CPU sampler)",
    add_arguments=_arguments,
    run=run_profile,
    examples=(
        "stallscope profile --run 3   # top frames and hottest stacks of run 3",
        "stallscope profile --run 3 --slow   # only what slow steps spent their CPU on",
        "stallscope profile --stage prefill --collapsed | flamegraph.pl > prefill.svg",
    ),
    description="Where the CPU time of traced threads went: each sample is one tick of the "
    "CPU sampler (cpu_sample_hz, 1 kHz by default) on a tracked thread that was on CPU, "
    "with its Python frames and native leaf. Off-CPU time is not here (see report).",
)
