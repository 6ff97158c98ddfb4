"""Socket activation: the listening sockets systemd (or systemd-socket-activate) passes.

Parses LISTEN_PID / LISTEN_FDS / LISTEN_FDNAMES as sd_listen_fds(3) defines
them: descriptors start at 3, belong to us only when LISTEN_PID is our pid,
and are named by FileDescriptorName= in the socket unit (default: the unit
name, e.g. "stallscope.socket"). Returns descriptors by name, marked
close-on-exec, and unsets the variables so that child processes do not think
the descriptors are theirs. It never opens, binds or closes a socket: the
caller decides what each descriptor is for and checks its type.
"""

import os
import socket

from stallscope.errors import ActivationError

SD_LISTEN_FDS_START = 3
ENV_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")

# FileDescriptorName= values the daemon understands (see systemd/stallscope.socket).
PROBE_FD_NAME = "probe"
API_FD_NAME = "api"


def listen_fds(environ=None, unset=True):
    """{name: [fd, ...]} passed to this process; {} when not socket-activated.

    A descriptor without a name (LISTEN_FDNAMES shorter than LISTEN_FDS, or
    unset) is listed under "unknown", as sd_listen_fds_with_names() does."""
    env = os.environ if environ is None else environ
    pid_s, n_s = env.get("LISTEN_PID"), env.get("LISTEN_FDS")
    names_s = env.get("LISTEN_FDNAMES")
    if unset and environ is None:
        for var in ENV_VARS:
            os.environ.pop(var, None)
    if not n_s:
        return {}
    try:
        n = int(n_s)
        pid = int(pid_s) if pid_s else None
    except ValueError:
        raise ActivationError(
            f"LISTEN_FDS={n_s!r} / LISTEN_PID={pid_s!r} are not numbers"
        ) from None
    if pid is not None and pid != os.getpid():
        return {}  # meant for another process (we were started by the activated one)
    if n < 0:
        raise ActivationError(f"LISTEN_FDS={n} is negative")
    names = names_s.split(":") if names_s else []
    fds = {}
    for i in range(n):
        fd = SD_LISTEN_FDS_START + i
        try:
            os.set_inheritable(fd, False)
        except OSError as exc:
            raise ActivationError(
                f"LISTEN_FDS={n} but descriptor {fd} is not open: {exc}"
            ) from None
        name = names[i] if i < len(names) and names[i] else "unknown"
        fds.setdefault(name, []).append(fd)
    return fds


def describe(fd):
    """(family, type, address) of a descriptor, for checks and log lines."""
    sock = socket.socket(fileno=os.dup(fd))
    try:
        return sock.family, sock.type, sock.getsockname()
    finally:
        sock.close()


def pick(fds, name, want_type=socket.SOCK_SEQPACKET):
    """The descriptor named `name`, or, when exactly one descriptor was passed
    without a usable name (systemd-socket-activate without --fdname), that one
    if its type is `want_type`. None when there is none."""
    if name in fds:
        if len(fds[name]) != 1:
            raise ActivationError(f"{len(fds[name])} descriptors named {name!r}; expected one")
        return fds[name][0]
    unnamed = [
        fd for key, group in fds.items() if key not in (PROBE_FD_NAME, API_FD_NAME) for fd in group
    ]
    matching = [fd for fd in unnamed if describe(fd)[1] == want_type]
    if len(matching) == 1:
        return matching[0]
    return None
