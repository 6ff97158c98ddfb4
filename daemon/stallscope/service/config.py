"""The daemon's configuration: defaults, /etc/stallscope/stallscope.toml, environment, flags.

Precedence, highest first: command-line flags, then STALLSCOPE_* environment
variables, then the TOML file (`--config PATH`, else $STALLSCOPE_CONFIG;
the unit passes /etc/stallscope/stallscope.toml), then the defaults.
Every key is declared once, in `config_keys.KEYS` (probe settings as
`ProbeSettings` fields), with its type, default, environment variable, flag
and whether it can change on SIGHUP ("live"). A file that does not parse,
an unknown key, a value of the wrong type or a combination that must not run
(the API on TCP without TLS) is refused with the file, line and reason; this
module never falls back to a partial configuration and never changes a
running daemon by itself (`service/systemd/reload.py` applies a reloaded one).

TOML is read with `tomllib` (Python 3.11+). On Python 3.10 it uses the
`tomli` package when installed (same API) and otherwise refuses a config
file with a message saying so; flags and environment still work.
"""

import os
import re
from dataclasses import fields

from stallscope.errors import ConfigError
from stallscope.probes.base import ProbeSettings
from stallscope.service.config_keys import (  # noqa: F401 (this module's public face)
    BY_DOTTED,
    CONFIG_ENV,
    DEFAULT_API_SOCKET,
    DEFAULT_CONFIG,
    DEFAULT_DB,
    DEFAULT_PROBE_SOCKET,
    KEYS,
    SECTIONS,
    Key,
)

try:  # Python 3.11+
    import tomllib as _toml
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as _toml
    except ModuleNotFoundError:
        _toml = None


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
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad(f"expected true or false, got {_tname(value)}")
        return value
    if kind in ("float", "int"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad(f"expected a number, got {_tname(value)}")
        if kind == "int" and value != int(value):
            raise bad(f"expected an integer, got {value!r}")
        value = float(value) if kind == "float" else int(value)
        if key.minimum is not None and value < key.minimum:
            raise bad(f"{value:g} is below the minimum {key.minimum:g}")
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
    if key.kind in ("float", "int"):
        try:
            return _convert(key, float(text), origin)
        except ValueError:
            raise ConfigError(f"{origin}: {key.dotted}: {text!r} is not a number") from None
    if key.kind == "bool":
        words = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
        if text.strip().lower() not in words:
            raise ConfigError(f"{origin}: {key.dotted}: {text!r} is not 1/0, true/false or yes/no")
        return words[text.strip().lower()]
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
                _convert(key, flag_value, f"flag {key.option}"),
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
    check_api(values, f"{path}: " if path else "")
    if values.get("metrics.listen"):
        parse_listen(values["metrics.listen"], f"{path}: " if path else "")


def parse_listen(listen, where=""):
    """(host, port) of the metrics endpoint 'HOST:PORT' ('[::1]:9464' for IPv6)."""
    host, sep, port = str(listen).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(
            f"{where}metrics.listen (--metrics-listen) wants HOST:PORT such as "
            f"127.0.0.1:9464, got {listen!r}"
        )
    return host, int(port)


def check_api(values, where=""):
    """The one check of the API's endpoints and TLS files: refuse plain-text
    TCP, half a TLS setup and unreadable files before anything starts."""
    listen, cert, key, ca = (
        values[f"api.{n}"] for n in ("listen", "tls_cert", "tls_key", "tls_client_ca")
    )
    if listen and not (cert and key):
        raise ConfigError(
            f"{where}refusing to serve the API on TCP {listen} "
            "without TLS: set api.tls_cert and api.tls_key (--tls-cert, "
            "--tls-key), or use api.socket for a local Unix socket"
        )
    if listen and ":" not in listen:
        raise ConfigError(f"{where}api.listen (--grpc-listen) wants HOST:PORT, got {listen!r}")
    if not listen and (cert or key or ca):
        raise ConfigError(
            f"{where}api.tls_cert, api.tls_key and api.tls_client_ca are for api.listen "
            "(--grpc-listen HOST:PORT); without it the API serves only api.socket"
        )
    if bool(cert) != bool(key):
        raise ConfigError(f"{where}api.tls_cert and api.tls_key go together")
    for what, name, path in (
        ("certificate", "tls_cert", cert),
        ("key", "tls_key", key),
        ("client CA", "tls_client_ca", ca),
    ):
        if path and not os.access(path, os.R_OK):
            raise ConfigError(f"{where}api.{name}: cannot read the TLS {what} at {path}")


def probe_settings(cfg, settings=None):
    """The ProbeSettings `cfg` sets (a new one, or `settings` updated in place)."""
    values = {
        f.name: cfg[f"probes.{f.name}"] for f in fields(ProbeSettings) if f"probes.{f.name}" in cfg
    }
    values["gpus"] = tuple(values.get("gpus", ()))
    if settings is None:
        return ProbeSettings(**values)
    for name, value in values.items():
        setattr(settings, name, value)
    return settings


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
    for section in dict.fromkeys(k.section for k in KEYS):
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
SERVICE_DEFAULTS = {"api.socket": DEFAULT_API_SOCKET}


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
