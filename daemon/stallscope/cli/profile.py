"""CPU stacks: `profile` (where the CPU time of traced threads went) and `stacks` (now).

`profile` reads the database (the file, or a running daemon's Query API
when it holds the file) through `analysis.profile` and prints top frames
(self and total) and the hottest stacks, or, with --collapsed, every stack
in the format flame-graph tools read. `stacks PID` asks the daemon, on its
probe socket (a STACKS datagram, probe_client/wire.py; the kernel tells
the daemon who asks), for every thread's stacks of a traced process as the
hang watchdog captures them, and prints them. Both only parse and print.
"""

import json
import os
import socket
import sys
import time

from stallscope.cli.command import Command, add_db_arguments
from stallscope.errors import StallscopeError

ANSWER_TIMEOUT_S = 15.0


class StacksRefused(StallscopeError):
    """The daemon refused a stacks request, or could not be asked; `code` is its code."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


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


def ask_stacks(socket_path, pid, timeout_s=ANSWER_TIMEOUT_S):
    """The daemon's answer to STACKS `pid` (a dict with ok true), or StacksRefused."""
    from probe_client import wire

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    parts = []
    try:
        sock.settimeout(timeout_s)
        try:
            sock.connect(socket_path)
        except OSError as exc:
            hint = ""
            if isinstance(exc, PermissionError):
                hint = " (the socket is for root and the group stallscope: join that group)"
            raise StacksRefused(
                f"cannot reach the daemon at {socket_path}: {exc.strerror or exc}{hint}",
                "UNAVAILABLE",
            ) from None
        header = wire.HEADER.pack(
            wire.MAGIC, wire.VERSION, wire.DGRAM_STACKS, 0, 0, 0, time.monotonic_ns(), 0, 0
        )
        deadline = time.monotonic() + timeout_s
        try:
            sock.send(header + json.dumps({"pid": pid}).encode())
            while True:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                data = sock.recv(wire.HEADER_SIZE + wire.STACKS_PART_MAX)
                if len(data) < wire.HEADER_SIZE:
                    raise StacksRefused("the daemon closed the connection without an answer")
                kind, left = data[3], wire.HEADER.unpack_from(data)[3]
                if kind != wire.DGRAM_STACKS:
                    raise StacksRefused(f"the daemon answered with datagram kind {kind}")
                parts.append(data[wire.HEADER_SIZE :])
                if left == 0:
                    break
        except TimeoutError:
            raise StacksRefused(
                f"no answer from the daemon at {socket_path} within {timeout_s:g} s (a daemon "
                "older than `stallscope stacks` does not answer)",
                "DEADLINE_EXCEEDED",
            ) from None
        except OSError as exc:
            raise StacksRefused(f"the daemon at {socket_path}: {exc.strerror or exc}") from None
    finally:
        sock.close()
    try:
        answer = json.loads(b"".join(parts))
    except ValueError:
        raise StacksRefused("the daemon's answer was not JSON") from None
    if not answer.get("ok"):
        code = answer.get("code") or "UNKNOWN"
        raise StacksRefused(f"{code}: {answer.get('reason')}", code)
    return answer


def format_stacks(answer):
    """Every thread, innermost frame first, as text."""
    out = [f"pid {answer['pid']}: {len(answer['threads'])} threads"]
    if answer.get("capture_ns") is not None:
        out[0] += f" (read in {answer['capture_ns'] / 1e6:.1f} ms, the process never stopped)"
    if answer.get("lacks"):
        out.append(f"lacks: {answer['lacks']}")
    for t in answer["threads"]:
        where = f"wchan {t['wchan']}" if t.get("wchan") else ""
        if t.get("syscall") is not None and t["syscall"] >= 0:
            where += f"{', ' if where else ''}syscall {t['syscall']}"
        out.append("")
        out.append(
            f"thread {t['tid']} {t['name']!r} state {t['state']}"
            f"{' (' + where + ')' if where else ''} [{t['source']}]"
        )
        if not t["frames"]:
            out.append("    (no frames)")
        for file, function, line in t["frames"]:
            at = f"{file}:{line}" if line else (file or "")
            out.append(f"    {function}  {at}".rstrip())
    return "\n".join(out) + "\n"


def _stacks_arguments(parser):
    parser.add_argument("pid", type=int, help="a process the daemon traces")
    parser.add_argument(
        "--socket",
        default=None,
        help="the daemon's probe socket (default: $STALLSCOPE_SOCKET or the probe "
        "client's default)",
    )
    parser.add_argument("--json", action="store_true", help="the daemon's answer as JSON")


def run_stacks(args):
    from probe_client import DEFAULT_SOCKET

    path = args.socket or os.environ.get("STALLSCOPE_SOCKET") or DEFAULT_SOCKET
    answer = ask_stacks(path, args.pid)
    if args.json:
        json.dump(answer, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_stacks(answer))
    return 0


STACKS = Command(
    help="every thread's stacks of a traced process, now, without stopping it",
    add_arguments=_stacks_arguments,
    run=run_stacks,
    examples=(
        "stallscope stacks 4242   # what each thread of pid 4242 is doing",
        "stallscope stacks 4242 --json | jq '.threads[].frames[0]'   # innermost frames",
        "stallscope stacks 4242 --socket /run/stallscope/probe.sock   # as root: any user's engine",
    ),
    description="Asks the daemon, on its probe socket, for the stacks of every thread of "
    "a process it traces, captured as the hang watchdog does: Python frames read through "
    "/proc/PID/mem (or the CPU sampler's latest stack of a thread on CPU) and each "
    "thread's kernel state; frames only, never locals or arguments. The process is never "
    "stopped or ptraced. Only root and the process's owner get an answer (the kernel "
    "tells the daemon who asks); requests are rate-limited per user.",
)
