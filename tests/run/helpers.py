"""Helpers for `stallscope run` tests: a real daemon, a toy engine that never
imports stallscope, and a helper that runs a command under the wrapper."""

import os
import subprocess
import sys
import textwrap

import pytest

from daemonproc import DaemonProcess

TOY_ENGINE = textwrap.dedent(
    """
    import time


    class Engine:
        def step(self, batch, *, wait_s=0.0005):
            time.sleep(wait_s)
            return len(batch)

        def schedule(self, n):
            return [0] * n
    """
)


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


def write_script(folder, name, body):
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def stallscope_run(args, cwd, env=None, **kwargs):
    """`stallscope run ARGS...` to completion: CompletedProcess (text)."""
    full_env = dict(os.environ if env is None else env)
    full_env.pop("PYTHONPATH", None) if env is None else None
    return subprocess.run(
        [sys.executable, "-m", "stallscope.cli", "run", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )
