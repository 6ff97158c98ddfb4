"""`stallscope deep`: open a diagnosis window on a running daemon.

Asks the daemon, through its API (StartDiagnosis), to attach the expensive
kernel probes (the syscall probe) for a while; service/deep.py does the
work. This module only parses the duration and prints the answer.
"""

from stallscope.cli.command import Command, env_default
from stallscope.errors import ApiError, StallscopeError
from stallscope.service.config import DEFAULT_API_SOCKET

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class DurationError(StallscopeError):
    """A --for value that is not a positive duration."""


def parse_duration_s(text):
    """Seconds from '90', '90s', '500ms', '5m', '1h'; DurationError otherwise."""
    t = str(text).strip().lower()
    scale = 1.0
    for unit in ("ms", "s", "m", "h"):
        if t.endswith(unit):
            t, scale = t[: -len(unit)], UNITS[unit]
            break
    try:
        value = float(t) * scale
    except ValueError:
        raise DurationError(f"--for wants a duration like 60s, 500ms or 5m, not {text!r}") from None
    if not value > 0:
        raise DurationError(f"--for wants a positive duration, not {text!r}")
    return value


def add_arguments(parser):
    parser.add_argument(
        "--for",
        dest="duration",
        default="60s",
        help="how long: 90, 90s, 500ms, 5m (default 60s; at most 1h)",
    )
    parser.add_argument(
        "--api-socket",
        default=env_default("STALLSCOPE_API_SOCKET", DEFAULT_API_SOCKET),
        help="the daemon's API socket (default: $STALLSCOPE_API_SOCKET or %(default)s)",
    )


def run(args):
    from stallscope.api.client import Client

    seconds = parse_duration_s(args.duration)
    client = Client(args.api_socket)
    try:
        reply = client.start_diagnosis(seconds)
    except ApiError as exc:
        raise ApiError(f"diagnosis window not opened: {exc}", exc.code) from None
    finally:
        client.close()
    probes = ", ".join(reply.probes)
    if reply.deep:
        print(f"the daemon runs with --deep: {probes} already attached for its whole life")
    else:
        print(f"diagnosis window open for {seconds:g} s: {probes} attached")
    return 0


DEEP = Command(
    help="open a diagnosis window: attach the expensive kernel probes (syscalls) for a while",
    add_arguments=add_arguments,
    run=run,
    examples=(
        "stallscope deep --for 60s   # syscall rows for the next minute",
        "stallscope deep --for 5m --api-socket /tmp/api.sock   # a daemon run by hand",
    ),
    description="Asks a running daemon (through its API) to attach the syscall probe for "
    "the given time; a window asked for during one extends it. Every syscall on the host "
    "is slower meanwhile (BENCHMARKS.md); `stallscope daemon --deep` keeps it attached.",
)
