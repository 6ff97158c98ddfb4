"""Where a read command reads from: the database file, or the daemon holding it.

DuckDB lets one process write a file and no other process open it while it
does. So `open_for_reading` opens the file read-only (`analysis.access.
FileSource`) when no daemon holds it, and asks the running daemon (gRPC
`Query` through `api.client.ApiSource`) when one does: the socket the user
named, the one the daemon published beside the database, the default.
"""

import os

from stallscope.analysis.access import FileSource
from stallscope.errors import AccessError


def _held_by_other_process(exc):
    text = str(exc)
    return "lock" in text.lower() or "Conflicting" in text


def api_socket_candidates(db_path, api_socket=None):
    """Where to look for the daemon holding `db_path`, best first: the socket
    the user named, the one the daemon published beside the database
    (service/systemd/endpoint.py), the configured default."""
    from stallscope.service.config import DEFAULT_API_SOCKET
    from stallscope.service.systemd.endpoint import published_socket

    found = [api_socket, published_socket(db_path), DEFAULT_API_SOCKET]
    out = []
    for sock in found:
        if sock and sock not in out:
            out.append(sock)
    return out


def open_for_reading(db_path, api_socket=None):
    """A FileSource, or an API source when a daemon holds the file. Without
    `api_socket`, the daemon's own published endpoint is used."""
    if not os.path.exists(db_path):
        raise AccessError(
            f"no database at {db_path} (is the daemon running with --db "
            f"{db_path}? set --db or $STALLSCOPE_DB)"
        )
    try:
        return FileSource(db_path)
    except AccessError as exc:
        if not _held_by_other_process(exc):
            raise
        candidates = api_socket_candidates(db_path, api_socket)
        for sock in candidates:
            if os.path.exists(sock):
                from stallscope.api.client import ApiSource

                return ApiSource(sock)
        raise AccessError(
            f"{db_path} is held by a running daemon and no API socket was found "
            f"(tried {', '.join(candidates)}): start the daemon with --api-socket, or "
            "point --api-socket at it"
        ) from None
