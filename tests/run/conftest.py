"""Fixtures of the `stallscope run` tests: a real daemon, a toy engine folder."""

import pytest

from helpers.daemonproc import DaemonProcess
from helpers.run import TOY_ENGINE


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProcess(tmp_path).start()
    yield d
    if d.proc.poll() is None:
        d.proc.kill()
        d.proc.wait()


@pytest.fixture
def engine_dir(tmp_path):
    """A folder with `toyengine.py`; commands run there (so it is importable)."""
    folder = tmp_path / "engine"
    folder.mkdir()
    (folder / "toyengine.py").write_text(TOY_ENGINE)
    return folder
