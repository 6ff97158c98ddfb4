"""The `stallscope` command: the parser, the table of commands, error handling.

`COMMANDS` maps each command name to its `Command` (arguments, entry point,
examples), defined in one module per command group: `cli/daemon.py`,
`cli/run.py`, `cli/demo.py`, `cli/read.py` (query, report, compare, status),
`cli/top.py`, `cli/deep.py`, `cli/export.py`, `cli/profile.py` (profile, stacks).
This is the one place that turns a `StallscopeError` raised below into
`error: ...` on stderr and an exit status (2; 130 on Ctrl-C); anything else
is a bug and keeps its traceback. Command modules import their heavy
dependencies inside their entry points, so `--help` stays fast.
"""

import argparse
import logging
import sys

from stallscope.cli import daemon, deep, demo, export, profile, read, run, top
from stallscope.errors import StallscopeError

# name -> Command, in --help order.
COMMANDS = {
    "daemon": daemon.DAEMON,
    "run": run.RUN,
    "demo": demo.DEMO,
    "query": read.QUERY,
    "report": read.REPORT,
    "compare": read.COMPARE,
    "top": top.TOP,
    "profile": profile.PROFILE,
    "stacks": profile.STACKS,
    "status": read.STATUS,
    "deep": deep.DEEP,
    "export": export.EXPORT,
}


def build_parser():
    parser = argparse.ArgumentParser(
        prog="stallscope",
        description="Why was that engine step slow? GC, preemption, migration, "
        "submit jitter or GPU clocks, step by step.",
        epilog="`stallscope COMMAND --help` shows a command's options and examples.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        command.register(sub, name)
    return parser


def main(argv=None):
    if (sys.argv[1:] if argv is None else list(argv))[:1] == ["daemon"]:
        # Before anything else: a SIGTERM during start-up is a stop request,
        # not a death with records clients already sent (service/systemd/stopping.py).
        from stallscope.service.systemd import stopping

        stopping.install()
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        return COMMANDS[args.command].run(args) or 0
    except StallscopeError as exc:
        print(f"error: {exc.user_message()}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
