"""`stallscope top`: the live terminal dashboard over a daemon's event stream.

Only the arguments live here (so `--help` imports no gRPC); `cli/top_screen.py`
draws the dashboard.
"""

from stallscope.cli.command import Command, env_default
from stallscope.service.config import DEFAULT_API_SOCKET


def add_arguments(parser):
    parser.add_argument(
        "--api-socket",
        default=env_default("STALLSCOPE_API_SOCKET", DEFAULT_API_SOCKET),
        help="the daemon's API socket (default: $STALLSCOPE_API_SOCKET or %(default)s)",
    )
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")


def run(args):
    from stallscope.cli import top_screen

    return top_screen.run(args.api_socket, duration_s=args.duration)


TOP = Command(
    help="live terminal dashboard over a daemon's event stream",
    add_arguments=add_arguments,
    run=run,
    examples=(
        "stallscope top   # the service's daemon",
        "stallscope top --api-socket /tmp/api.sock --duration 30   # a daemon run by hand",
    ),
)
