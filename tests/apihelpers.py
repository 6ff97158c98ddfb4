"""Helpers for the API tests: a real daemon serving its gRPC API, polling."""

import time

import pytest

from daemonproc import DaemonProcess


def wait_for(pred, timeout_s=15.0, interval_s=0.02):
    """Poll `pred` until it returns something truthy (returned) or time runs out (None)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(interval_s)
    return None


def start_api_daemon(path, extra=()):
    """A daemon process with its API on `path`/api.sock (plus `extra` arguments)."""
    api_socket = str(path / "api.sock")
    d = DaemonProcess(path, extra_args=["--api-socket", api_socket, *extra]).start()
    d.api_socket = api_socket
    return d


def stop(d):
    """SIGTERM the daemon if it runs; it must exit 0."""
    if d.proc is not None and d.proc.poll() is None:
        rc, _ = d.stop()
        assert rc == 0, d.read_log()


# Fixtures, imported by the API test modules. (Not in a tests/api/conftest.py:
# other test folders do `from conftest import ...`, and a second module named
# conftest would shadow tests/conftest.py for them.)
@pytest.fixture
def api_daemon(tmp_path):
    d = start_api_daemon(tmp_path)
    yield d
    if d.proc.poll() is None:
        d.proc.kill()
        d.proc.wait()


@pytest.fixture
def client(api_daemon):
    from stallscope.api.client import Client

    c = Client(api_daemon.api_socket)
    c.wait_ready()
    yield c
    c.close()
