"""A real daemon serving its gRPC API, for the API tests (fixtures: tests/api/conftest.py)."""

from helpers.daemonproc import DaemonProcess


def start_api_daemon(path, extra=(), preamble=None):
    """A daemon process with its API on `path`/api.sock (plus `extra` arguments;
    `preamble`: Python it runs first, as DaemonProcess's)."""
    api_socket = str(path / "api.sock")
    d = DaemonProcess(
        path, extra_args=["--api-socket", api_socket, *extra], preamble=preamble
    ).start()
    d.api_socket = api_socket
    return d


def stop(d):
    """SIGTERM the daemon if it runs; it must exit 0."""
    if d.proc is not None and d.proc.poll() is None:
        rc, _ = d.stop()
        assert rc == 0, d.read_log()
