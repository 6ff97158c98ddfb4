"""`stallscope daemon`: run the daemon in the foreground.

Its flags are generated from `service.config.KEYS`, so a setting has one
declaration (type, default, environment variable, file key, flag) and the
flags default to None: `config.resolve` then applies the precedence flags >
STALLSCOPE_* environment > file > defaults. This module only builds the
objects the daemon needs from the resolved configuration and runs it.
"""

import argparse
import logging
import os

from stallscope.cli.command import Command
from stallscope.service import config
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))


def _int_list(text):
    """`--gpus 0,1` and `--pid 7 --pid 8` alike: a list of integers."""
    try:
        return [int(p) for p in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants integers like 0,1, not {text!r}") from None


def _add_key_flag(parser, key):
    where = f"[{key.section}] {key.name}" + (f", ${key.env}" if key.env else "")
    live = "; reloads on SIGHUP" if key.live else ""
    metavar = key.metavar or {"str": "PATH", "float": "N", "int": "N"}.get(key.kind)
    kwargs = {"dest": key.flag, "default": None, "metavar": metavar}
    if key.kind == "choice":
        kwargs.update(choices=key.choices, metavar=None)
    elif key.kind == "float":
        kwargs["type"] = float
    elif key.kind == "int":
        kwargs["type"] = int
    elif key.kind == "ints":
        kwargs.update(type=_int_list, action="extend")
    elif key.kind == "bool":
        kwargs.update(action=argparse.BooleanOptionalAction, metavar=None)
    shown = f"{key.default!r}" if key.default not in ("", [], ()) else "none"
    parser.add_argument(key.option, help=f"{key.doc} ({where}; default {shown}{live})", **kwargs)


def add_arguments(parser):
    parser.add_argument(
        "--config",
        default=None,
        metavar="PATH",
        help="TOML configuration file (default: $STALLSCOPE_CONFIG; the "
        f"service uses {config.DEFAULT_CONFIG})",
    )
    for key in config.KEYS:
        if key.flag:
            _add_key_flag(parser, key)


def run(args):
    from stallscope.service.server import Daemon
    from stallscope.service.systemd import activation, stopping
    from stallscope.service.systemd.notify import Notifier
    from stallscope.store.retention import Limits

    source = config.Source(flags=dict(vars(args)), config_file=args.config)
    cfg = source.load()
    fds = activation.listen_fds()
    probe_fd = activation.pick(fds, activation.PROBE_FD_NAME)
    for name, group in fds.items():
        if name == activation.API_FD_NAME:
            # grpcio binds its own listeners by address only (no inherited fd):
            # close what systemd passed and bind api.socket ourselves.
            log.warning(
                "systemd passed an API socket, but the gRPC server cannot serve on an "
                "inherited socket; binding %s instead",
                cfg["api.socket"] or "nothing",
            )
            for fd in group:
                os.close(fd)
    if probe_fd is not None:
        family, kind, address = activation.describe(probe_fd)
        log.info("probe socket from systemd: fd %d (%s)", probe_fd, address or "unnamed")
    settings = config.probe_settings(cfg)
    limits = Limits(
        cfg["retention.max_db_mb"], cfg["retention.max_age_days"], cfg["retention.check_interval_s"]
    )

    def backend(value):
        return None if value == "auto" else value

    api_options = cfg.api_options()  # checked by config.check_api while loading
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
        step_fill_interval_s=cfg["daemon.step_fill_interval_s"],
        step_fill_cpu_share=cfg["daemon.step_fill_cpu_share"],
        max_backlog_rows=cfg["daemon.max_backlog_rows"],
        duckdb_threads=cfg["daemon.duckdb_threads"],
        keep_off_engine_cpus=cfg["daemon.keep_off_engine_cpus"],
        stop_event=stopping.STOP,
        metrics_listen=cfg["metrics.listen"] or None,
        metrics_max_label_values=cfg["metrics.max_label_values"],
    )
    return daemon.run()


DAEMON = Command(
    help="run the daemon in the foreground (logs to stderr)",
    description="Run the daemon in the foreground, logging to stderr. Settings come from "
    "flags, then STALLSCOPE_* environment variables, then the config file, then defaults "
    "(docs/systemd.md). SIGHUP reloads the settings marked so.",
    add_arguments=add_arguments,
    run=run,
    examples=(
        "stallscope daemon --socket /tmp/probe.sock --db /tmp/s.duckdb   # by hand, as any user",
        f"stallscope daemon --config {config.DEFAULT_CONFIG}   # as the service runs it",
        "stallscope daemon --api-socket /tmp/api.sock --metrics-listen 127.0.0.1:9464 "
        "--pid 4242   # API, /metrics, trace a pid",
    ),
)
