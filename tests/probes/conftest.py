"""Fixtures for the probe tests: the fake H200 NVML installed, a real Store, this
interpreter's own layout report."""

import json

import pytest

from stallscope.store.database import Store
from stallscope.testing import fake_nvml


@pytest.fixture
def fake():
    f = fake_nvml.FakeNvml(gpus=2, depth=101)  # 100 gaps: an even count
    undo = fake_nvml.install(f)
    yield f
    undo()


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "t.duckdb")
    yield s
    s.close()


@pytest.fixture(scope="module")
def report():
    """This interpreter's own PYLAYOUT report (the tests run on CPython 3.11)."""
    from probe_client import _pythreads

    rep = json.loads(_pythreads.Reporter().layout)
    assert rep["status"] == "ok", rep
    return rep
