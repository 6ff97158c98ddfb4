"""sd_notify(3) without libsystemd: tells the service manager how the daemon is.

Sends READY=1 once sockets are bound and probes attached, STATUS= lines
naming the active probes and what the daemon is doing, WATCHDOG=1 at half of
$WATCHDOG_USEC while the main loop and the database writer are alive,
RELOADING=1/READY=1 around a SIGHUP reload, and STOPPING=1 at shutdown.
The socket is $NOTIFY_SOCKET (a path, or '@name' for the abstract namespace).
Without $NOTIFY_SOCKET every call does nothing. It never raises into the
daemon and never blocks: a lost notification is logged once, not retried.
"""

import logging
import os
import socket
import time

from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

# STATUS= is refreshed at most this often when only counters changed (systemctl
# status shows it; the manager has no use for 10 updates a second).
STATUS_REFRESH_S = 5.0


def watchdog_interval_s(environ=None):
    """Seconds between WATCHDOG=1 pings (half of $WATCHDOG_USEC), or None."""
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
    if not usec:
        return None
    try:
        if pid and int(pid) != os.getpid():
            return None
        usec = int(usec)
    except ValueError:
        return None
    return usec / 2e6 if usec > 0 else None


class Notifier:
    """The daemon's `notify` object: ready(daemon), tick(daemon), reloading(),
    reloaded(daemon), stopping()."""

    def __init__(self, environ=None):
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET") or None
        if address and address.startswith("@"):
            address = "\0" + address[1:]
        elif address and not address.startswith("/"):
            log.warning("NOTIFY_SOCKET=%r is neither a path nor @abstract; not notifying", address)
            address = None
        self.address = address
        self.watchdog_s = watchdog_interval_s(env) if address else None
        self._sock = None
        self._next_ping = 0.0
        self._status = None
        self._status_at = 0.0
        self._warned = False
        self.sent = []  # every message, kept small: tests and `status` read it
        if address:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.setblocking(False)
        # The variables describe this process only; children must not reuse them.
        if environ is None:
            for var in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
                os.environ.pop(var, None)

    @property
    def enabled(self):
        return self._sock is not None

    def send(self, *fields):
        """Send one notification made of KEY=VALUE fields; True if it went out."""
        if self._sock is None:
            return False
        message = "\n".join(fields)
        try:
            self._sock.sendto(message.encode("utf-8", "replace"), self.address)
        except OSError as exc:
            if not self._warned:
                log.warning(
                    "cannot notify the service manager at %r: %s",
                    self.address.replace("\0", "@"),
                    exc,
                )
                self._warned = True
            return False
        if len(self.sent) < 1000:
            self.sent.append(message)
        return True

    # ----- what the daemon calls ------------------------------------------------
    def ready(self, daemon):
        status = status_line(daemon)
        self._status, self._status_at = status, time.monotonic()
        self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")
        if self.watchdog_s:
            self.send("WATCHDOG=1")
            self._next_ping = time.monotonic() + self.watchdog_s

    def tick(self, daemon):
        if self._sock is None:
            return
        now = time.monotonic()
        if self.watchdog_s and now >= self._next_ping and _healthy(daemon):
            self.send("WATCHDOG=1")
            self._next_ping = now + self.watchdog_s
        if now - self._status_at >= STATUS_REFRESH_S:
            self.update_status(daemon)

    def update_status(self, daemon, force=False):
        status = status_line(daemon)
        if force or status != self._status:
            self.send(f"STATUS={status}")
            self._status = status
        self._status_at = time.monotonic()

    def reloading(self):
        self.send("RELOADING=1", "STATUS=reloading configuration")

    def reloaded(self, daemon, error=None):
        status = status_line(daemon)
        if error:
            status = f"configuration NOT reloaded ({error}); {status}"
        self._status, self._status_at = status, time.monotonic()
        self.send("READY=1", f"STATUS={status}")

    def stopping(self):
        self.send("STOPPING=1", "STATUS=stopping: flushing the database")

    def close(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _healthy(daemon):
    """Ping the watchdog only while the database writer thread runs: a dead
    writer means data is piling up in memory, and a restart is the fix."""
    store = getattr(daemon, "store", None)
    thread = getattr(store, "_thread", None)
    return thread is None or thread.is_alive()


def status_line(daemon):
    """One line for `systemctl status`: probes, rates, clients, records."""
    probes = ", ".join(daemon.active_probes()) or "none"
    parts = [f"probes: {probes}"]
    settings = getattr(daemon, "settings", None)
    if settings is not None:
        parts.append(f"rates: sched {settings.sched_poll_hz:g} Hz, gpu {settings.gpu_poll_hz:g} Hz")
    ingest = getattr(daemon, "ingest", None)
    if ingest is not None:
        parts.append(f"clients: {len(ingest.conns)}")
        parts.append(f"records: {ingest.records_received}")
    return "; ".join(parts)
