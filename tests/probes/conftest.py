"""Fixtures for the GPU probe tests: the fake H200 NVML installed, a real Store."""

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
