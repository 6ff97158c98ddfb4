"""`stallscope run` on an interpreter older than the probe client supports.

The client needs Python 3.10+. On 3.9 and older the injected start-up code
(probe_client/_site/sitecustomize.py) must not try: it says so once for the
whole command (its children, run by the same old interpreter, stay quiet),
traces nothing, still runs the user's own sitecustomize, and the command's
output and exit status pass through. Tested with pyenv's 3.9 (a failure
under STALLSCOPE_REQUIRE_PYTHONS=1 when there is none).
"""

import os
from pathlib import Path

import pytest

from helpers import pythons
from helpers.run import stallscope_run, write_script

pytestmark = pytest.mark.daemon


def test_python_39_is_not_traced_and_says_so_once(daemon, tmp_path):
    versions = pythons.pyenv_versions("3.9")
    pythons.require_python(versions, "no pyenv 3.9.* on this machine")
    old = str(Path(pythons.pyenv_root()) / "versions" / versions[-1] / "bin" / "python3")
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    script = write_script(
        tmp_path,
        "old.py",
        """
        import os, subprocess, sys
        child = subprocess.run([sys.executable, "-c", "import sys; print('probe_client' in sys.modules)"],
                               capture_output=True, text=True)
        sys.stderr.write(child.stderr)
        print(os.environ.get("USER_SITE_RAN"), "probe_client" in sys.modules, child.stdout.strip())
        sys.exit(5)
        """,
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(user_site)
    done = stallscope_run(
        ["--socket", daemon.socket, "--attach", "old:Engine.step=step", "--", old, script],
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 5, done.stderr
    assert done.stdout.split() == ["yes", "False", "False"], (done.stdout, done.stderr)
    said = [line for line in done.stderr.splitlines() if "stallscope" in line]
    assert len(said) == 1, done.stderr
    assert "not tracing" in said[0] and "older than 3.10" in said[0], said
    assert daemon.stop()[0] == 0
    assert daemon.query("SELECT count(*) FROM runs") == [(0,)]
