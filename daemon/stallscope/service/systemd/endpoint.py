"""Where a running daemon's API is, published beside its database.

DuckDB lets one process hold a database file, so while the daemon runs, read
commands (`query`, `report`, `compare`, `status`) must go through its API.
The daemon writes `<db>.api` (JSON: API socket path, daemon pid; mode 0640,
as the database) when its API starts and removes it when it stops; a reader
given only `--db` finds the socket there. A file left by a daemon that died
is recognised by its pid and ignored. Never holds anything but a path.
"""

import json
import logging
import os

from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))


def endpoint_path(db_path):
    return os.path.abspath(db_path) + ".api"


def publish(db_path, api_socket):
    """Write `<db>.api` atomically; a failure is logged, never fatal."""
    path = endpoint_path(db_path)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        with os.fdopen(fd, "w") as f:
            json.dump({"api_socket": os.path.abspath(api_socket), "pid": os.getpid()}, f)
        os.rename(tmp, path)
    except OSError as exc:
        log.warning("could not publish the API endpoint at %s: %s", path, exc)


def withdraw(db_path):
    try:
        os.unlink(endpoint_path(db_path))
    except OSError:
        pass


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def published_socket(db_path):
    """The API socket a live daemon published for `db_path`, else None."""
    try:
        with open(endpoint_path(db_path)) as f:
            info = json.load(f)
        sock, pid = info["api_socket"], int(info["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not _alive(pid) or not os.path.exists(sock):
        return None
    return sock
