"""The `stallscope` command: daemon, demo, query, report, compare, top, status.

Each subcommand is a thin layer over a module that does the work; this file
only parses arguments, turns expected failures into one-line errors with a
non-zero exit, and picks the way to the data: through a running daemon's API
when one holds the database, from the file otherwise (DuckDB allows one
writer process).
"""

import argparse
import logging
import os
import sys

DEFAULT_SOCKET = "/run/stallscope/probe.sock"
DEFAULT_API_SOCKET = "/run/stallscope/api.sock"
DEFAULT_DB = "/var/lib/stallscope/stallscope.duckdb"


class UserError(Exception):
    """An expected failure: printed as `error: ...`, exit status 2."""


def _env(name, default):
    return os.environ.get(name) or default


def _add_db(p):
    p.add_argument(
        "--db",
        default=_env("STALLSCOPE_DB", DEFAULT_DB),
        help="DuckDB file (default: $STALLSCOPE_DB or %(default)s)",
    )
    p.add_argument(
        "--api-socket",
        default=_env("STALLSCOPE_API_SOCKET", DEFAULT_API_SOCKET),
        help="a running daemon's API socket, used when it holds the database",
    )


def build_parser():
    parser = argparse.ArgumentParser(
        prog="stallscope",
        description="Why was that engine step slow? GC, preemption, migration, "
        "submit jitter or GPU clocks, step by step.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    # Daemon flags default to None so that daemon/config.py can apply its
    # precedence: flags, then STALLSCOPE_* environment, then the file, then defaults.
    d = sub.add_parser(
        "daemon",
        help="run the daemon in the foreground (logs to stderr)",
        description="Settings come from flags, then STALLSCOPE_* environment "
        "variables, then the config file, then defaults "
        "(docs/systemd.md). SIGHUP reloads rates and retention.",
    )
    d.add_argument(
        "--config",
        default=None,
        help="TOML configuration file (default: $STALLSCOPE_CONFIG; the "
        "service uses /etc/stallscope/stallscope.toml)",
    )
    d.add_argument(
        "--socket",
        default=None,
        help=f"probe socket path (default: $STALLSCOPE_SOCKET, config, {DEFAULT_SOCKET}); "
        "ignored when systemd passes the socket",
    )
    d.add_argument("--db", default=None, help=f"DuckDB file (default: {DEFAULT_DB})")
    d.add_argument(
        "--api-socket",
        default=None,
        help=f"gRPC API Unix socket (e.g. {DEFAULT_API_SOCKET}); none by default",
    )
    # --- gRPC API over TCP (TLS only; see docs/api.md) ---
    d.add_argument(
        "--grpc-listen",
        metavar="HOST:PORT",
        default=None,
        help="also serve the API on TCP; needs --tls-cert and --tls-key",
    )
    d.add_argument("--tls-cert", default=None, help="PEM certificate chain for --grpc-listen")
    d.add_argument("--tls-key", default=None, help="PEM private key for --grpc-listen")
    d.add_argument(
        "--tls-client-ca",
        default=None,
        help="PEM CA bundle: require client certificates it signed (mutual TLS)",
    )
    d.add_argument(
        "--pid",
        type=int,
        action="append",
        default=None,
        help="also trace this process's threads (no probe client needed)",
    )
    d.add_argument(
        "--sched-backend",
        choices=["auto", "bcc", "perf", "proc", "none"],
        help="force a scheduling probe backend (default: best available)",
    )
    d.add_argument(
        "--gpu-backend",
        choices=["auto", "nvml", "none"],
        help="force the GPU probe on or off (default: on when a GPU exists)",
    )
    d.add_argument(
        "--kernel-causes",
        choices=["auto", "none"],
        help="page-fault, IRQ, steal and syscall probes (default: auto, where they can run)",
    )
    d.add_argument(
        "--deep",
        action="store_true",
        default=None,
        help="keep the syscall probe attached for the daemon's life (slows every "
        "syscall on the host; default: only in `stallscope deep` windows)",
    )
    d.add_argument(
        "--syscall-threshold-us",
        type=float,
        default=None,
        help="syscalls at least this long are rows of their own (50)",
    )
    d.add_argument("--gpu-poll-hz", type=float, default=None, help="NVML polling rate (10)")
    d.add_argument("--gpus", default=None, help="NVML indices to sample, e.g. 0,1 (default all)")
    d.add_argument(
        "--proc-poll-hz",
        type=float,
        default=None,
        help="/proc scheduling backend sampling rate (100)",
    )
    d.add_argument(
        "--allow-uid",
        type=int,
        action="append",
        default=None,
        help="accept probe connections only from these uids (default: any "
        "that can open the socket)",
    )
    d.add_argument(
        "--max-db-mb",
        type=float,
        default=None,
        help="retention: keep the database's used size under this (MiB; 0 = no limit)",
    )
    d.add_argument(
        "--max-age-days",
        type=float,
        default=None,
        help="retention: delete runs older than this (days; 0 = no limit)",
    )

    m = sub.add_parser(
        "demo",
        help="run a daemon, the built-in serving-engine scenario, and the attribution report",
    )
    m.add_argument("--duration", type=float, default=45.0, help="scenario seconds (default 45)")
    m.add_argument("--db", default=None, help="keep the database here (default: a temp dir)")
    m.add_argument("--rate", type=float, default=1.0, help="request arrivals per second")
    m.add_argument(
        "--no-gc-pressure",
        dest="gc_pressure",
        action="store_false",
        help="run without the seed's leaky timing hook (no steady-state gen-2)",
    )
    m.add_argument("--sched-backend", choices=["bcc", "perf", "proc", "none"])
    m.add_argument("--out", default=None, help="where to write the report's PNG figures")

    q = sub.add_parser("query", help="run a named query (a view) or SQL")
    q.add_argument("sql", nargs="?", help="a view name (see --list) or a SQL query")
    q.add_argument("--list", action="store_true", help="list the named queries and tables")
    q.add_argument("--format", choices=["table", "csv", "json"], default="table")
    q.add_argument("--limit", type=int, default=None, help="at most this many rows")
    _add_db(q)

    r = sub.add_parser("report", help="the attribution report: text tables and PNG figures")
    r.add_argument("--run", type=int, action="append", default=None, help="only these runs")
    r.add_argument("--out", default=None, help="directory for PNG figures")
    _add_db(r)

    c = sub.add_parser("compare", help="compare two runs side by side")
    c.add_argument("run_a", help="run id or label")
    c.add_argument("run_b", help="run id or label")
    _add_db(c)

    t = sub.add_parser("top", help="live terminal dashboard over a daemon's event stream")
    t.add_argument("--api-socket", default=_env("STALLSCOPE_API_SOCKET", DEFAULT_API_SOCKET))
    t.add_argument("--duration", type=float, default=None, help="stop after this many seconds")

    s = sub.add_parser("status", help="what the daemon holds: runs, probes, losses")
    _add_db(s)

    w = sub.add_parser(
        "deep",
        help="open a diagnosis window: attach the expensive kernel probes (syscalls) for a while",
        description="Asks a running daemon (through its API) to attach the syscall probe "
        "for the given time; a window asked for during one extends it. Every syscall on "
        "the host is slower meanwhile (BENCHMARKS.md). Example: stallscope deep --for 60s",
    )
    w.add_argument(
        "--for",
        dest="duration",
        default="60s",
        help="how long: 90, 90s, 500ms, 5m (default 60s; at most 1h)",
    )
    w.add_argument("--api-socket", default=_env("STALLSCOPE_API_SOCKET", DEFAULT_API_SOCKET))
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    handler = globals()["cmd_" + args.command]
    try:
        return handler(args) or 0
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


# ----- subcommands ---------------------------------------------------------------
def cmd_daemon(args):
    from stallscope.probes.base import ProbeSettings
    from stallscope.service import activation, config
    from stallscope.service.notify import Notifier
    from stallscope.service.retention import Limits
    from stallscope.service.server import Daemon

    flags = dict(vars(args))
    if flags.get("gpus") is not None:
        try:
            flags["gpus"] = [int(g) for g in flags["gpus"].split(",") if g.strip()]
        except ValueError:
            raise UserError(f"--gpus wants indices like 0,1, not {args.gpus!r}") from None
    source = config.Source(flags=flags, config_file=args.config)
    try:
        cfg = source.load()
    except config.ConfigError as exc:
        raise UserError(f"configuration refused: {exc}") from None
    try:
        fds = activation.listen_fds()
        probe_fd = activation.pick(fds, activation.PROBE_FD_NAME)
    except activation.ActivationError as exc:
        raise UserError(f"socket activation: {exc}") from None
    for name, group in fds.items():
        if name == activation.API_FD_NAME:
            # grpcio binds its own listeners by address only (no inherited fd):
            # close what systemd passed and bind api.socket ourselves.
            logging.getLogger("stallscope.daemon").warning(
                "systemd passed an API socket, but the gRPC server cannot serve on an "
                "inherited socket; binding %s instead",
                cfg["api.socket"] or "nothing",
            )
            for fd in group:
                os.close(fd)
    if probe_fd is not None:
        family, kind, address = activation.describe(probe_fd)
        logging.getLogger("stallscope.daemon").info(
            "probe socket from systemd: fd %d (%s)", probe_fd, address or "unnamed"
        )
    settings = ProbeSettings(
        gpu_poll_hz=cfg["probes.gpu_poll_hz"],
        sched_poll_hz=cfg["probes.sched_poll_hz"],
        gpus=tuple(cfg["probes.gpus"]),
        kernel_causes=cfg["probes.kernel_causes"] != "none",
        deep=cfg["probes.deep"],
        syscall_threshold_us=cfg["probes.syscall_threshold_us"],
    )
    limits = Limits(
        cfg["retention.max_db_mb"], cfg["retention.max_age_days"], cfg["retention.check_interval_s"]
    )

    def backend(value):
        return None if value == "auto" else value

    api_options = cfg.api_options()
    if api_options:
        from stallscope.api.server import ApiConfigError, check_api_options

        try:  # refuse plain-text TCP and bad TLS files before anything starts
            check_api_options(cfg["api.socket"] or None, **api_options)
        except ApiConfigError as exc:
            raise UserError(str(exc)) from None
    daemon = Daemon(
        cfg["daemon.socket"],
        cfg["daemon.db"],
        api_socket=cfg["api.socket"] or None,
        listen_fd=probe_fd,
        pids=cfg["daemon.pids"],
        sched_backend=backend(cfg["probes.sched_backend"]),
        gpu_backend=backend(cfg["probes.gpu_backend"]),
        settings=settings,
        allowed_uids=cfg["daemon.allow_uids"] or None,
        notify=Notifier(),
        api_options=api_options,
        config_source=source,
        config=cfg,
        retention_limits=limits,
    )
    return daemon.run()


def cmd_demo(args):
    from stallscope.demo import runner

    return runner.run_demo(args)


def _open_readonly(args):
    from stallscope.analysis import access

    try:
        return access.open_for_reading(args.db, args.api_socket)
    except access.AccessError as exc:
        raise UserError(str(exc)) from None


def cmd_query(args):
    from stallscope.analysis import access, formatting

    if args.list:
        sql = access.LIST_NAMES
    elif args.sql:
        sql = access.named_or_sql(args.sql)
    else:
        raise UserError("give a view name or SQL (or --list to see the names)")
    source = _open_readonly(args)
    try:
        columns, rows = source.query(sql, limit=args.limit)
    except access.AccessError as exc:
        raise UserError(str(exc)) from None
    finally:
        source.close()
    sys.stdout.write(formatting.format_rows(columns, rows, args.format))
    return 0


def cmd_status(args):
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


def cmd_report(args):
    from stallscope.analysis import report

    source = _open_readonly(args)
    try:
        print(report.build_report(source.connection(), out_dir=args.out, run_ids=args.run))
    finally:
        source.close()
    return 0


def cmd_compare(args):
    from stallscope.analysis import compare

    source = _open_readonly(args)
    try:
        print(compare.compare_runs(source.connection(), args.run_a, args.run_b))
    except compare.RunNotFound as exc:
        raise UserError(str(exc)) from None
    finally:
        source.close()
    return 0


def parse_duration_s(text):
    """Seconds from '90', '90s', '500ms', '5m', '1h'; UserError otherwise."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    t = str(text).strip().lower()
    for unit in ("ms", "s", "m", "h"):
        if t.endswith(unit):
            t, scale = t[: -len(unit)], units[unit]
            break
    else:
        scale = 1.0
    try:
        value = float(t) * scale
    except ValueError:
        raise UserError(f"--for wants a duration like 60s, 500ms or 5m, not {text!r}") from None
    if not value > 0:
        raise UserError(f"--for wants a positive duration, not {text!r}")
    return value


def cmd_deep(args):
    from stallscope.api.client import ApiError, Client

    seconds = parse_duration_s(args.duration)
    try:
        client = Client(args.api_socket)
        try:
            reply = client.start_diagnosis(seconds)
        finally:
            client.close()
    except ApiError as exc:
        raise UserError(f"diagnosis window not opened: {exc}") from None
    probes = ", ".join(reply.probes)
    if reply.deep:
        print(f"the daemon runs with --deep: {probes} already attached for its whole life")
    else:
        print(f"diagnosis window open for {seconds:g} s: {probes} attached")
    return 0


def cmd_top(args):
    from stallscope.api import top

    return top.run(args.api_socket, duration_s=args.duration)


if __name__ == "__main__":
    sys.exit(main())
