"""Unix socket paths the daemon binds: parent directory, stale files, owners.

A socket file left by a daemon that died is removed; one that someone still
listens on is not, and the caller says who is there. Shared by the probe
socket (SOCK_SEQPACKET) and the API socket (gRPC, SOCK_STREAM).
"""

import os
import socket


def prepare_path(path, sock_type):
    """Create the parent directory and remove a stale socket file at `path`.

    Returns False when a live listener answers there (nothing is touched)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if not os.path.exists(path):
        return True
    probe = socket.socket(socket.AF_UNIX, sock_type)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # stale: nobody listens there
        return True
    finally:
        probe.close()
    return False
