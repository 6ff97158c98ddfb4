"""Unix socket paths the daemon binds: parent directory, stale files, owners.

A socket file left by a daemon that died is removed; one that someone still
listens on is not, and the caller says who is there. Shared by the probe
socket (SOCK_SEQPACKET) and the API socket (gRPC, SOCK_STREAM). A socket the
daemon binds itself appears at its path only once it listens, with its final
mode and group (bound under a temporary name, then renamed): a client that
sees the path can connect, never ECONNREFUSED on a half-made socket.
"""

import logging
import os
import socket

from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))


def bind_listening(sock, path, backlog, mode, group=None):
    """Bind `sock` at `path`, listening, mode `mode` (and `group`), atomically."""
    tmp = os.path.join(
        os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.{os.getpid()}"
    )
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    old = os.umask(0o177)  # born 0600 under its temporary name, never wider
    try:
        sock.bind(tmp)
    finally:
        os.umask(old)
    try:
        os.chmod(tmp, mode)
        if group is not None:
            try:
                os.chown(tmp, -1, group)
            except OSError as exc:
                log.warning("could not give %s to group %s: %s", path, group, exc)
        sock.listen(backlog)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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
