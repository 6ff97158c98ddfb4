"""`stallscope run` against a real daemon, on engines whose source never imports us.

Every step of the engine is stored with its batch size, the exit status,
stdout and a SIGTERM pass through unchanged, child processes (multiprocessing
spawn and fork, a subprocess) are runs of their own labelled after their
parent, a bad spec is reported once (stderr and `run_events`) while the good
ones keep working, and an absent daemon is only a warning."""

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from helpers.run import stallscope_run, write_script
from stallscope.cli.run import site_dir

pytestmark = pytest.mark.daemon

STEP_SPEC = "toyengine:Engine.step=step,batch=len(arg0)"

APP = """
    import sys
    import toyengine

    engine = toyengine.Engine()
    for i in range(40):
        engine.step([0] * (i % 4 + 1))
    print("engine done", "stallscope" in sys.modules)
    sys.exit(3)
"""


def _spans(daemon, label=None):
    where = "WHERE r.label = ?" if label else ""
    return daemon.query(
        "SELECT s.kind, s.batch FROM spans s JOIN runs r USING (run_id) "
        f"{where} ORDER BY s.start_ns",
        [label] if label else None,
    )


def test_every_step_is_stored_and_the_exit_status_passes_through(daemon, engine_dir):
    script = write_script(engine_dir, "app.py", APP)
    done = stallscope_run(
        [
            "--socket",
            daemon.socket,
            "--label",
            "toy",
            "--attach",
            STEP_SPEC,
            "--",
            sys.executable,
            script,
        ],
        cwd=engine_dir,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "engine done False\n"  # stdout untouched; the engine saw no stallscope
    assert "stallscope:" not in done.stderr
    daemon.stop()
    assert _spans(daemon, "toy") == [("step", i % 4 + 1) for i in range(40)]
    assert daemon.query("SELECT kind, target FROM run_events") == [("attached", STEP_SPEC)]


def test_targets_imported_before_us_are_patched_and_the_users_sitecustomize_runs(
    daemon, engine_dir, tmp_path
):
    # The user's own sitecustomize imports the engine before our hook exists.
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text(
        "import toyengine\nimport os\nos.environ['USER_SITE_RAN'] = 'yes'\n"
    )
    script = write_script(
        engine_dir,
        "early.py",
        """
        import os, sys, toyengine
        assert getattr(toyengine.Engine.step, "__stallscope_kind__", None) == "step"
        toyengine.Engine().step([1, 2, 3])
        print(os.environ.get("USER_SITE_RAN"), sys.modules["sitecustomize"].__file__)
        """,
    )
    env = dict(os.environ, PYTHONPATH=f"{user_site}{os.pathsep}{engine_dir}")
    done = stallscope_run(
        [
            "--socket",
            daemon.socket,
            "--label",
            "early",
            "--attach",
            STEP_SPEC,
            "--",
            sys.executable,
            script,
        ],
        cwd=engine_dir,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["yes", str(user_site / "sitecustomize.py")]
    daemon.stop()
    assert _spans(daemon, "early") == [("step", 3)]


def test_child_processes_are_runs_of_their_own(daemon, engine_dir):
    script = write_script(
        engine_dir,
        "kids.py",
        """
        import multiprocessing as mp, subprocess, sys, toyengine

        def work(n):
            engine = toyengine.Engine()
            for _ in range(n):
                engine.step([1, 2])

        if __name__ == "__main__":
            work(5)
            for method, n in (("spawn", 7), ("fork", 6)):
                p = mp.get_context(method).Process(target=work, args=(n,))
                p.start()
                p.join()
            code = "import toyengine; e = toyengine.Engine(); [e.step([1]) for _ in range(3)]"
            subprocess.run([sys.executable, "-c", code], check=True)
        """,
    )
    done = stallscope_run(
        [
            "--socket",
            daemon.socket,
            "--label",
            "kids",
            "--attach",
            STEP_SPEC,
            "--",
            sys.executable,
            script,
        ],
        cwd=engine_dir,
    )
    assert done.returncode == 0, done.stderr
    assert "stallscope:" not in done.stderr  # children never say "never imported"
    daemon.stop()
    rows = daemon.query(
        "SELECT r.label, r.pid, count(s.run_id), min(s.batch) FROM runs r "
        "LEFT JOIN spans s USING (run_id) GROUP BY ALL ORDER BY min(r.run_id)"
    )
    by_steps = {}
    for label, pid, steps, batch in rows:
        if steps:
            by_steps[steps] = (label, pid, batch)
    assert by_steps[5][0] == "kids"
    assert re.fullmatch(rf"kids/child-{by_steps[7][1]}", by_steps[7][0])  # spawn
    assert re.fullmatch(rf"kids/fork-{by_steps[6][1]}", by_steps[6][0])
    assert re.fullmatch(rf"kids/child-{by_steps[3][1]}", by_steps[3][0]) and by_steps[3][2] == 1
    assert len({pid for _, pid, _ in by_steps.values()}) == 4


def test_bad_specs_are_reported_once_and_the_rest_keeps_working(daemon, engine_dir, tmp_path):
    toml = tmp_path / "extra.toml"
    toml.write_text(
        '[[attach]]\ntarget = "toyengine:Engine.schedule"\nkind = "schedule"\nbatch = 3\n'
    )
    bad = [
        "toyengine:Engine.nope=step",  # missing attribute
        "nomodule:X.y=step",  # a module never imported
        "toyengine:Engine.schedule=schedule,batch=arg0.__class__",  # EXPR outside the language
        "toyengine:Engine.schedule=sched,batch=len(arg0",  # not a spec
    ]
    script = write_script(engine_dir, "app.py", APP)
    args = ["--socket", daemon.socket, "--label", "bad", "--attach-file", str(toml)]
    for spec in [STEP_SPEC, *bad]:
        args += ["--attach", spec]
    done = stallscope_run([*args, "--", sys.executable, script], cwd=engine_dir)
    assert done.returncode == 3
    assert done.stdout == "engine done False\n"
    lines = [line for line in done.stderr.splitlines() if line.startswith("stallscope:")]
    assert len(lines) == 5, done.stderr  # once each: four specs and the TOML entry
    assert all(sum(spec in line for line in lines) == 1 for spec in bad[:3]), lines
    assert sum("[[attach]] #1" in line and "batch must be" in line for line in lines) == 1
    daemon.stop()
    assert _spans(daemon, "bad") == [("step", i % 4 + 1) for i in range(40)]
    events = dict(
        (target, kind) for kind, target in daemon.query("SELECT kind, target FROM run_events")
    )
    assert events[bad[0]] == "attach_failed"
    assert events[bad[1]] == "never_imported"
    assert events[bad[2]] == "attach_failed"
    assert events[STEP_SPEC] == "attached"
    assert daemon.scalar("SELECT count(*) FROM run_events WHERE kind = 'spec_error'") == 2


def test_sigterm_reaches_the_command_and_its_status_comes_back(daemon, engine_dir):
    script = write_script(
        engine_dir,
        "serve.py",
        """
        import sys, time, toyengine
        engine = toyengine.Engine()
        engine.step([1])
        print("ready", flush=True)
        while True:
            engine.step([1, 1], wait_s=0.01)
        """,
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stallscope.cli",
            "run",
            "--socket",
            daemon.socket,
            "--attach",
            STEP_SPEC,
            "--",
            sys.executable,
            script,
        ],
        cwd=engine_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)  # to the wrapper's pid: the command is that process
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    daemon.stop()
    assert daemon.scalar("SELECT count(*) FROM spans WHERE batch = 1") == 1


def test_an_absent_daemon_is_a_warning(engine_dir, tmp_path):
    script = write_script(engine_dir, "app.py", APP)
    missing = str(tmp_path / "no-daemon.sock")
    done = stallscope_run(
        ["--socket", missing, "--attach", STEP_SPEC, "--", sys.executable, script], cwd=engine_dir
    )
    assert done.returncode == 3 and done.stdout == "engine done False\n"
    assert f"warning: no daemon at {missing}" in done.stderr
    assert (
        done.stderr.count("no daemon") == 1
    )  # the wrapper says it; the process does not repeat it


def test_a_missing_command_is_the_shells_127(tmp_path):
    done = stallscope_run(["--", str(tmp_path / "nothing-here")], cwd=tmp_path)
    assert done.returncode == 127 and "error:" in done.stderr


def test_the_injected_folder_exposes_only_the_client(daemon, engine_dir):
    assert set(os.listdir(site_dir())) <= {"sitecustomize.py", "__pycache__"}
    system_python = "/usr/bin/python3"
    if not os.access(system_python, os.X_OK):
        pytest.skip("needs the distribution's /usr/bin/python3 (a Python without stallscope)")
    script = write_script(
        engine_dir,
        "which.py",
        """
        import importlib.util, sys, toyengine
        toyengine.Engine().step([1, 2])
        print(importlib.util.find_spec("stallscope") is None, "probe_client" in sys.modules)
        """,
    )
    done = stallscope_run(
        [
            "--socket",
            daemon.socket,
            "--label",
            "sys",
            "--attach",
            STEP_SPEC,
            "--",
            system_python,
            script,
        ],
        cwd=engine_dir,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]
    daemon.stop()
    assert _spans(daemon, "sys") == [("step", 2)]


def test_environment_and_toml_without_the_wrapper(daemon, engine_dir, tmp_path):
    # A systemd unit's way: Environment=PYTHONPATH=... and a TOML file.
    toml = tmp_path / "engine.toml"
    toml.write_text(
        '[[attach]]\ntarget = "toyengine:Engine.step"\nkind = "step"\nbatch = "len(arg0)"\n'
    )
    script = write_script(engine_dir, "app.py", APP)
    env = dict(
        os.environ,
        PYTHONPATH=site_dir(),
        STALLSCOPE_SOCKET=daemon.socket,
        STALLSCOPE_RUN_LABEL="unit",
        STALLSCOPE_ATTACH_FILE=str(toml),
    )
    done = subprocess.run(
        [shutil.which("python3") or sys.executable, script],
        cwd=engine_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    daemon.stop()
    assert len(_spans(daemon, "unit")) == 40


def test_print_env_and_presets(tmp_path):
    done = stallscope_run(["--preset", "transformers", "--label", "x", "--print-env"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"export PYTHONPATH={site_dir()}" in done.stdout
    assert "export STALLSCOPE_ATTACH=" in done.stdout and "ContinuousBatch" in done.stdout
    listed = stallscope_run(["--list-presets"], cwd=tmp_path)
    assert {line.split()[0] for line in listed.stdout.splitlines()} >= {
        "transformers",
        "vllm",
        "sglang",
    }
    unknown = stallscope_run(["--preset", "nosuch", "--", "true"], cwd=tmp_path)
    assert unknown.returncode == 2 and "no preset named 'nosuch'" in unknown.stderr
