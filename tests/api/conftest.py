"""Fixtures for the API tests: a daemon serving its API, and a client of it."""

import pytest

from helpers.api import start_api_daemon
from stallscope.api.client import Client


@pytest.fixture
def api_daemon(tmp_path):
    d = start_api_daemon(tmp_path)
    yield d
    if d.proc.poll() is None:
        d.proc.kill()
        d.proc.wait()


@pytest.fixture
def client(api_daemon):
    c = Client(api_daemon.api_socket)
    c.wait_ready()
    yield c
    c.close()
