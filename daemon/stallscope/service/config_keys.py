"""Every setting of the daemon, declared once: the table `KEYS`.

A `Key` says its section and name (the file's `[section] name`), its type,
default, environment variable, `stallscope daemon` flag and whether SIGHUP
applies it without a restart ("live"). The [probes] keys that tune probe
backends are made from `ProbeSettings`' fields (probes/base.py), so a probe
setting is declared in one place, beside the code that reads it. The
default paths are written here only. `config.py` reads, converts and checks
values against this table; `cli/daemon.py` makes the flags from it. This
module declares; it never reads files or the environment.
"""

from dataclasses import dataclass, fields

from stallscope.probes.base import ProbeSettings

# The default paths, written here only (the CLI's read commands, the shipped
# stallscope.toml and the docs take them from here; probe_client keeps its
# own copy of the probe socket, checked equal by tests/test_layout.py).
DEFAULT_PROBE_SOCKET = "/run/stallscope/probe.sock"
DEFAULT_DB = "/var/lib/stallscope/stallscope.duckdb"
# The service's API socket (the bare command serves no API by default).
DEFAULT_API_SOCKET = "/run/stallscope/api.sock"
# Where scripts/install.sh puts the file and the unit points --config.
DEFAULT_CONFIG = "/etc/stallscope/stallscope.toml"
CONFIG_ENV = "STALLSCOPE_CONFIG"


@dataclass(frozen=True)
class Key:
    section: str
    name: str
    kind: str  # "str", "float", "int", "bool", "ints", "choice"
    default: object
    env: str | None  # STALLSCOPE_* variable, or None
    flag: str | None  # argparse dest of the `stallscope daemon` flag, or None
    live: bool = False  # applied on SIGHUP without a restart
    choices: tuple = ()
    minimum: float | None = None
    doc: str = ""
    metavar: str | None = None  # for the flag's --help

    @property
    def option(self):
        """The `stallscope daemon` flag as typed, e.g. --max-db-mb (None: no flag)."""
        return "--" + self.flag.replace("_", "-") if self.flag else None

    @property
    def dotted(self):
        return f"{self.section}.{self.name}"


def _probe_keys():
    """[probes] keys made from ProbeSettings' fields: type, default and doc there.
    A field of another type is no key (tests/test_settings.py fails on it)."""
    kinds = {"str": "str", "float": "float", "int": "int", "bool": "bool", "tuple": "ints"}
    out = []
    for f in fields(ProbeSettings):
        declared = dict(f.metadata)
        kind = kinds.get(f.type if isinstance(f.type, str) else f.type.__name__)
        if kind is None:
            continue
        if kind == "str" and declared.get("choices"):
            kind = "choice"  # a str field declared with its choices
        default = list(f.default) if kind == "ints" else f.default
        out.append(
            Key(
                "probes",
                f.name,
                kind,
                default,
                declared.pop("env", f"STALLSCOPE_{f.name.upper()}"),
                declared.pop("flag", f.name),
                **declared,
            )
        )
    return out


_DAEMON_AND_BACKEND_KEYS = [
    Key(
        "daemon",
        "socket",
        "str",
        DEFAULT_PROBE_SOCKET,
        "STALLSCOPE_SOCKET",
        "socket",
        doc="probe socket path (ignored when systemd passes the socket)",
    ),
    Key(
        "daemon",
        "db",
        "str",
        DEFAULT_DB,
        "STALLSCOPE_DB",
        "db",
        doc="DuckDB database file",
    ),
    Key(
        "daemon",
        "allow_uids",
        "ints",
        [],
        "STALLSCOPE_ALLOW_UIDS",
        "allow_uid",
        metavar="UID",
        doc="accept probe connections only from these uids; empty = any that can open the socket",
    ),
    Key(
        "daemon",
        "pids",
        "ints",
        [],
        "STALLSCOPE_PIDS",
        "pid",
        metavar="PID",
        doc="also trace these processes (no probe client needed)",
    ),
    Key(
        "daemon",
        "step_fill_interval_s",
        "float",
        60.0,
        "STALLSCOPE_STEP_FILL_INTERVAL_S",
        "step_fill_interval_s",
        minimum=0.1,
        doc="store settled steps' attribution components (step_components) at most this often, "
        "seconds (a cycle costs ~0.2 s of CPU whatever its size: planning the views; steps not "
        "filled yet are computed when read)",
    ),
    Key(
        "daemon",
        "step_fill_cpu_share",
        "float",
        0.001,
        "STALLSCOPE_STEP_FILL_CPU_SHARE",
        "step_fill_cpu_share",
        minimum=0.0001,
        doc="space the step fill's cycles so that they use at most this share of one core "
        "(after a cycle of c CPU-seconds the next waits c / share, at most 600 s, at least "
        "step_fill_interval_s); 1 = every step_fill_interval_s",
    ),
    Key(
        "daemon",
        "max_backlog_rows",
        "int",
        500_000,
        "STALLSCOPE_MAX_BACKLOG_ROWS",
        "max_backlog_rows",
        minimum=10_000,
        doc="rows queued for the database beyond which new rows are dropped and recorded as "
        "losses (reason daemon_backlog); ingest pauses reading clients at half of it",
    ),
    Key(
        "daemon",
        "duckdb_threads",
        "int",
        1,
        "STALLSCOPE_DUCKDB_THREADS",
        "duckdb_threads",
        minimum=1,
        doc="DuckDB worker threads (1: none of its own; more are started at idle priority)",
    ),
    Key(
        "daemon",
        "keep_off_engine_cpus",
        "bool",
        True,
        "STALLSCOPE_KEEP_OFF_ENGINE_CPUS",
        "keep_off_engine_cpus",
        doc="keep the daemon's threads off the CPUs traced processes may run on, and its "
        "store flushes off the CPUs their step threads last ran on, when another CPU is allowed",
    ),
    Key(
        "probes",
        "sched_backend",
        "choice",
        "auto",
        "STALLSCOPE_SCHED_BACKEND",
        "sched_backend",
        choices=("auto", "bcc", "perf", "proc", "none"),
        doc="scheduling probe backend; auto = best available",
    ),
    Key(
        "probes",
        "gpu_backend",
        "choice",
        "auto",
        "STALLSCOPE_GPU_BACKEND",
        "gpu_backend",
        choices=("auto", "nvml", "none"),
        doc="GPU probe; auto = on when a GPU exists",
    ),
]
_RETENTION_AND_API_KEYS = [
    Key(
        "retention",
        "max_db_mb",
        "float",
        10240.0,
        "STALLSCOPE_MAX_DB_MB",
        "max_db_mb",
        live=True,
        minimum=0,
        doc="keep the database's used size under this many MiB; 0 = no limit",
    ),
    Key(
        "retention",
        "max_age_days",
        "float",
        30.0,
        "STALLSCOPE_MAX_AGE_DAYS",
        "max_age_days",
        live=True,
        minimum=0,
        doc="delete runs older than this many days; 0 = no limit",
    ),
    Key(
        "retention",
        "check_interval_s",
        "float",
        300.0,
        "STALLSCOPE_RETENTION_INTERVAL_S",
        "retention_interval_s",
        live=True,
        minimum=1,
        doc="how often the limits are checked, seconds",
    ),
    Key(
        "api",
        "socket",
        "str",
        "",
        "STALLSCOPE_API_SOCKET",
        "api_socket",
        doc="gRPC API Unix socket; empty = no API",
    ),
    Key(
        "api",
        "listen",
        "str",
        "",
        "STALLSCOPE_API_LISTEN",
        "grpc_listen",
        metavar="HOST:PORT",
        doc="gRPC on TCP host:port as well; refused without tls_cert and tls_key",
    ),
    Key(
        "api",
        "tls_cert",
        "str",
        "",
        "STALLSCOPE_API_TLS_CERT",
        "tls_cert",
        doc="PEM certificate chain for the TCP listener",
    ),
    Key(
        "api",
        "tls_key",
        "str",
        "",
        "STALLSCOPE_API_TLS_KEY",
        "tls_key",
        doc="PEM private key for the TCP listener",
    ),
    Key(
        "api",
        "tls_client_ca",
        "str",
        "",
        "STALLSCOPE_API_TLS_CLIENT_CA",
        "tls_client_ca",
        doc="PEM CA bundle: when set, clients must present a certificate it signed",
    ),
]

_METRICS_KEYS = [
    Key(
        "metrics",
        "listen",
        "str",
        "",
        "STALLSCOPE_METRICS_LISTEN",
        "metrics_listen",
        metavar="HOST:PORT",
        doc="serve Prometheus /metrics over plain HTTP on host:port; empty = off",
    ),
    Key(
        "metrics",
        "max_label_values",
        "int",
        32,
        "STALLSCOPE_METRICS_MAX_LABEL_VALUES",
        "metrics_max_label_values",
        minimum=1,
        doc="distinct run labels (and stages) /metrics keeps; later ones are folded into 'other'",
    ),
]

_EXPORT_KEYS = [
    Key(
        "export",
        "parquet_dir",
        "str",
        "",
        "STALLSCOPE_EXPORT_DIR",
        "export_dir",
        doc="directory of the Parquet export (`stallscope export parquet` asks the daemon "
        "to write there, and only there); empty = the daemon exports nothing",
    ),
    Key(
        "export",
        "host",
        "str",
        "",
        "STALLSCOPE_EXPORT_HOST",
        "export_host",
        metavar="NAME",
        doc="host name of this daemon's export partitions; empty = the hostname",
    ),
    Key(
        "export",
        "after_retention",
        "bool",
        False,
        "STALLSCOPE_EXPORT_AFTER_RETENTION",
        "export_after_retention",
        doc="export to parquet_dir after every retention check (retention.check_interval_s)",
    ),
]

_HANG_KEYS = [
    Key(
        "hang",
        "watchdog",
        "bool",
        True,
        "STALLSCOPE_HANG_WATCHDOG",
        "hang_watchdog",
        doc="detect runs whose steps stopped ending while busy and dump every thread's "
        "stacks (docs/hang.md)",
    ),
    Key(
        "hang",
        "threshold_ms",
        "float",
        0.0,
        "STALLSCOPE_HANG_THRESHOLD_MS",
        "hang_threshold_ms",
        minimum=0,
        doc="a run with no step end for this long while busy is hung; 0 = per run, "
        "max(hang.p99_factor x its p99 step, hang.min_threshold_ms); an engine "
        "started with STALLSCOPE_RUN_HANG_THRESHOLD_MS has its own",
    ),
    Key(
        "hang",
        "min_threshold_ms",
        "float",
        5000.0,
        "STALLSCOPE_HANG_MIN_THRESHOLD_MS",
        "hang_min_threshold_ms",
        minimum=1,
        doc="the automatic threshold is never below this",
    ),
    Key(
        "hang",
        "p99_factor",
        "float",
        10.0,
        "STALLSCOPE_HANG_P99_FACTOR",
        "hang_p99_factor",
        minimum=1,
        doc="the automatic threshold is this many times the run's p99 busy step",
    ),
    Key(
        "hang",
        "min_dump_interval_s",
        "float",
        60.0,
        "STALLSCOPE_HANG_MIN_DUMP_INTERVAL_S",
        "hang_min_dump_interval_s",
        minimum=0,
        doc="at most one dump per run this often (and one in flight at a time); a hang "
        "inside it is recorded and counted without its threads",
    ),
]

_REQUEST_KEYS = [
    Key(
        "requests",
        "open_timeout_s",
        "float",
        600.0,
        "STALLSCOPE_REQUESTS_OPEN_TIMEOUT_S",
        "requests_open_timeout_s",
        minimum=1,
        doc="an open request with no event for this long (its run's client time) is evicted: "
        "its row ends 'evicted', counted in ingest_errors as request_open_timeout",
    ),
]

# In the order the shipped stallscope.toml lists them.
KEYS = (
    _DAEMON_AND_BACKEND_KEYS
    + _probe_keys()
    + _RETENTION_AND_API_KEYS
    + _METRICS_KEYS
    + _HANG_KEYS
    + _REQUEST_KEYS
    + _EXPORT_KEYS
)
BY_DOTTED = {k.dotted: k for k in KEYS}
SECTIONS = sorted({k.section for k in KEYS})
