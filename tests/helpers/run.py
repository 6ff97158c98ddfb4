"""For the `stallscope run` tests: a toy engine that never imports stallscope,
and a runner of commands under the wrapper."""

import os
import subprocess
import textwrap

from helpers.daemonproc import DAEMON_PYTHON

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


def write_script(folder, name, body):
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def stallscope_run(args, cwd, env=None):
    """`stallscope run ARGS...` to completion: CompletedProcess (text).
    Without `env`: this environment less PYTHONPATH (the tests set their own)."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [DAEMON_PYTHON, "-m", "stallscope.cli", "run", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
