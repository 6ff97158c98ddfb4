"""The daemon's configuration: defaults, /etc/stallscope/stallscope.toml, environment, flags.

Precedence, highest first: command-line flags, then STALLSCOPE_* environment
variables, then the TOML file (`--config PATH`, else $STALLSCOPE_CONFIG;
the unit passes /etc/stallscope/stallscope.toml), then the defaults in
`KEYS`. Every key is declared once in `KEYS` with its type, default,
environment variable, flag and whether it can change on SIGHUP ("live").
A file that does not parse, an unknown key or a value of the wrong type is
refused with the file, line and reason; this module never falls back to a
partial configuration and never changes a running daemon by itself
(`daemon/reload.py` applies a reloaded configuration).

TOML is read with `tomllib` (Python 3.11+). On Python 3.10 it uses the
`tomli` package when installed (same API) and otherwise refuses a config
file with a message saying so; flags and environment still work.
"""

import os
import re
from dataclasses import dataclass

try:  # Python 3.11+
    import tomllib as _toml
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as _toml
    except ModuleNotFoundError:
        _toml = None

# Where scripts/install.sh puts the file and the unit points --config.
DEFAULT_CONFIG = "/etc/stallscope/stallscope.toml"
CONFIG_ENV = "STALLSCOPE_CONFIG"


class ConfigError(Exception):
    """A configuration the daemon refuses: str() says where and why."""


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

    @property
    def dotted(self):
        return f"{self.section}.{self.name}"


KEYS = [
    Key(
        "daemon",
        "socket",
        "str",
        "/run/stallscope/probe.sock",
        "STALLSCOPE_SOCKET",
        "socket",
        doc="probe socket path (ignored when systemd passes the socket)",
    ),
    Key(
        "daemon",
        "db",
        "str",
        "/var/lib/stallscope/stallscope.duckdb",
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
        doc="accept probe connections only from these uids; empty = any that can open the socket",
    ),
    Key(
        "daemon",
        "pids",
        "ints",
        [],
        "STALLSCOPE_PIDS",
        "pid",
        doc="also trace these processes (no probe client needed)",
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
    Key(
        "probes",
        "sched_poll_hz",
        "float",
        100.0,
        "STALLSCOPE_SCHED_POLL_HZ",
        "proc_poll_hz",
        live=True,
        minimum=0.1,
        doc="/proc scheduling backend sampling rate, Hz",
    ),
    Key(
        "probes",
        "gpu_poll_hz",
        "float",
        10.0,
        "STALLSCOPE_GPU_POLL_HZ",
        "gpu_poll_hz",
        live=True,
        minimum=0.1,
        doc="NVML polling rate, Hz",
    ),
    Key(
        "probes",
        "gpus",
        "ints",
        [],
        "STALLSCOPE_GPUS",
        "gpus",
        doc="NVML device indices to sample; empty = all",
    ),
    Key(
        "probes",
        "kernel_causes",
        "choice",
        "auto",
        "STALLSCOPE_KERNEL_CAUSES",
        "kernel_causes",
        choices=("auto", "none"),
        doc="page-fault, IRQ, steal and syscall probes (docs/kernel-causes.md); "
        "auto = each where it can run",
    ),
    Key(
        "probes",
        "deep",
        "bool",
        False,
        "STALLSCOPE_DEEP",
        "deep",
        doc="keep the expensive probes (syscalls: every syscall on the host gets "
        "slower) attached for the daemon's life, not only in diagnosis windows",
    ),
    Key(
        "probes",
        "syscall_threshold_us",
        "float",
        50.0,
        "STALLSCOPE_SYSCALL_THRESHOLD_US",
        "syscall_threshold_us",
        minimum=1,
        doc="syscalls at least this long (us) are rows of their own; shorter ones are summed",
    ),
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
BY_DOTTED = {k.dotted: k for k in KEYS}
SECTIONS = sorted({k.section for k in KEYS})


class Config(dict):
    """Effective settings: "section.name" -> value, plus where each came from."""

    def __init__(self, values, sources, path):
        super().__init__(values)
        self.sources = sources  # "section.name" -> "flag" | "env" | "file" | "default"
        self.path = path  # the file read, or None

    def section(self, name):
        return {k.split(".", 1)[1]: v for k, v in self.items() if k.startswith(name + ".")}

    def api_options(self):
        """Keyword arguments for start_api_server beyond the socket (only those set)."""
        rename = {"tls_client_ca": "client_ca"}  # start_api_server's parameter name
        return {
            rename.get(name, name): value
            for name, value in self.section("api").items()
            if name != "socket" and value
        }


# ----- parsing ---------------------------------------------------------------------
def _convert(key, value, origin):
    """The value as key.kind, or ConfigError naming the key and the origin."""

    def bad(why):
        return ConfigError(f"{origin}: {key.dotted}: {why}")

    kind = key.kind
    if kind in ("str", "choice"):
        if not isinstance(value, str):
            raise bad(f"expected a string, got {_tname(value)}")
        if kind == "choice" and value not in key.choices:
            raise bad(f"{value!r} is not one of {', '.join(key.choices)}")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad(f"expected a number, got {_tname(value)}")
        value = float(value)
        if key.minimum is not None and value < key.minimum:
            raise bad(f"{value:g} is below the minimum {key.minimum:g}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad(f"expected true or false, got {_tname(value)}")
        return value
    if kind == "ints":
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise bad(f"expected a list of integers, got {_tname(value)}")
        return list(value)
    raise AssertionError(kind)


def _tname(value):
    return {
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        list: "a list",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def _from_env_text(key, text):
    """Environment variables are strings: parse them as the key's kind."""
    origin = f"environment {key.env}"
    if key.kind == "float":
        try:
            return _convert(key, float(text), origin)
        except ValueError:
            raise ConfigError(f"{origin}: {key.dotted}: {text!r} is not a number") from None
    if key.kind == "bool":
        word = text.strip().lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(f"{origin}: {key.dotted}: {text!r} is not true or false")
    if key.kind == "ints":
        try:
            return [int(p) for p in re.split(r"[,\s]+", text.strip()) if p]
        except ValueError:
            raise ConfigError(
                f"{origin}: {key.dotted}: {text!r} is not a comma-separated list of integers"
            ) from None
    return _convert(key, text, origin)


def _locate(text, section, name=None):
    """1-based line of `name = ...` inside [section] (or of the [section]
    header), for error messages; None when not found."""
    current = None
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        m = re.match(r"^\[\s*([A-Za-z0-9_.-]+)\s*\]", stripped)
        if m:
            current = m.group(1)
            if name is None and current == section:
                return lineno
            continue
        if (
            name is not None
            and current == section
            and re.match(rf"^{re.escape(name)}\s*=", stripped)
        ):
            return lineno
    return None


def read_file(path):
    """{"section.name": value} from a TOML file; ConfigError with line and reason."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    text = raw.decode("utf-8", "replace")
    if _toml is None:
        raise ConfigError(
            f"{path}: reading TOML needs Python 3.11+ or the `tomli` package "
            "(pip install tomli) on Python 3.10"
        )
    try:
        data = _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        # The message ends with "(at line N, column M)": that is the line and reason.
        raise ConfigError(f"{path}: {exc}") from None
    values = {}
    for section, table in data.items():
        if section not in SECTIONS:
            line = _locate(text, section)
            raise ConfigError(
                f"{path}:{line or '?'}: unknown section [{section}] (known: {', '.join(SECTIONS)})"
            )
        if not isinstance(table, dict):
            raise ConfigError(
                f"{path}:{_locate_key_anywhere(text, section) or '?'}: "
                f"{section} must be a table ([{section}])"
            )
        for name, value in table.items():
            key = BY_DOTTED.get(f"{section}.{name}")
            line = _locate(text, section, name)
            origin = f"{path}:{line or '?'}"
            if key is None:
                known = ", ".join(k.name for k in KEYS if k.section == section)
                raise ConfigError(
                    f"{origin}: unknown key {section}.{name} (known in [{section}]: {known})"
                )
            values[key.dotted] = _convert(key, value, origin)
    return values


def _locate_key_anywhere(text, name):
    for lineno, line in enumerate(text.splitlines(), 1):
        if re.match(rf"^\s*{re.escape(name)}\s*=", line):
            return lineno
    return None


def config_path(flag_path=None, environ=None):
    """The file to read, or None. There is no implicit default: the unit passes
    `--config /etc/stallscope/stallscope.toml`, so a daemon started by hand or
    by a test never picks up the host's service configuration by surprise."""
    env = os.environ if environ is None else environ
    return flag_path or env.get(CONFIG_ENV) or None


def resolve(flags=None, config_file=None, environ=None):
    """The effective Config. `flags`: {argparse dest: value or None (not given)}."""
    env = os.environ if environ is None else environ
    flags = flags or {}
    path = config_path(config_file, env)
    file_values = read_file(path) if path else {}
    values, sources = {}, {}
    for key in KEYS:
        flag_value = flags.get(key.flag) if key.flag else None
        if flag_value not in (None, []):
            value, source = (
                _convert(key, flag_value, f"flag --{key.flag.replace('_', '-')}"),
                "flag",
            )
        elif key.env and env.get(key.env):
            value, source = _from_env_text(key, env[key.env]), "env"
        elif key.dotted in file_values:
            value, source = file_values[key.dotted], "file"
        else:
            value, source = key.default, "default"
        values[key.dotted], sources[key.dotted] = value, source
    _check_combinations(values, path)
    return Config(values, sources, path)


def _check_combinations(values, path):
    where = path or "configuration"
    if values["api.listen"] and not (values["api.tls_cert"] and values["api.tls_key"]):
        raise ConfigError(
            f"{where}: refusing to serve the API on TCP {values['api.listen']} "
            "without TLS: set api.tls_cert and api.tls_key (--tls-cert, "
            "--tls-key), or use api.socket for a local Unix socket"
        )
    if bool(values["api.tls_cert"]) != bool(values["api.tls_key"]):
        raise ConfigError(f"{where}: api.tls_cert and api.tls_key go together")


class Source:
    """Where a running daemon's configuration comes from, so SIGHUP can
    re-read the file while flags and environment keep their precedence."""

    def __init__(self, flags=None, config_file=None, environ=None):
        self.flags = dict(flags or {})
        self.config_file = config_file
        self.environ = dict(os.environ if environ is None else environ)

    def load(self):
        return resolve(self.flags, self.config_file, self.environ)


def diff(old, new):
    """[(key, old value, new value)] for every key whose value changed."""
    return [(BY_DOTTED[k], old[k], new[k]) for k in BY_DOTTED if old.get(k) != new.get(k)]


def render_default_file():
    """The documented default stallscope.toml, generated from KEYS."""
    lines = [
        "# stallscope daemon configuration.",
        "# Precedence: command-line flags > STALLSCOPE_* environment > this file > defaults.",
        "# Keys marked (live) change on `systemctl reload stallscope` (SIGHUP); the others",
        "# need a restart. Unknown keys are errors.",
        "",
    ]
    for section in ("daemon", "probes", "retention", "api"):
        lines.append(f"[{section}]")
        for key in (k for k in KEYS if k.section == section):
            live = " (live)" if key.live else ""
            env = f"; env {key.env}" if key.env else ""
            lines.append(f"# {key.doc}{live}{env}")
            value = SERVICE_DEFAULTS.get(key.dotted, key.default)
            lines.append(f"{key.name} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


# What the installed file sets where the service differs from the bare command.
SERVICE_DEFAULTS = {"api.socket": "/run/stallscope/api.sock"}


def _toml_value(value):
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if value != int(value) else f"{value:.1f}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)
