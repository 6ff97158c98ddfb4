"""A real `stallscope daemon` child process for a test, in its tmp_path.

The daemon runs on this interpreter, or on STALLSCOPE_DAEMON_PYTHON when
set: the probe client's tests run on every supported interpreter
(tests/pythons/) while the daemon, with its dependencies, stays on the main
venv's. Without duckdb here, `query()` reads the file through that one.

A daemon whose database does not exist yet starts on a copy of the
session's template (helpers/schema_db.py): the schema and views are made
once per session, not ~0.7 s per daemon. `fresh_file=True` leaves the file
to the daemon, for tests of creating one.
"""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

from stallscope.demo.child import DaemonChild

DAEMON_PYTHON = os.environ.get("STALLSCOPE_DAEMON_PYTHON") or sys.executable

_TEMPLATE = {"path": None}


def _foreign_template():
    """The template database made once by the daemon's Python (this one has
    no duckdb: the probe client's tests on another interpreter)."""
    if _TEMPLATE["path"] is None:
        folder = tempfile.mkdtemp(prefix="stallscope-schema-")
        atexit.register(shutil.rmtree, folder, True)
        path = os.path.join(folder, "template.duckdb")
        subprocess.run([DAEMON_PYTHON, "-c", _MAKE_TEMPLATE, path], check=True)
        _TEMPLATE["path"] = path
    return _TEMPLATE["path"]


_MAKE_TEMPLATE = """
import sys
import duckdb
from stallscope.store.migrations import apply_schema
con = duckdb.connect(sys.argv[1])
apply_schema(con)
con.execute("CHECKPOINT")
con.close()
"""

_QUERY = """
import json, sys
import duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
rows = con.execute(sys.argv[2], json.loads(sys.argv[3])).fetchall()
print(json.dumps(rows, default=str))
"""


class DaemonProcess(DaemonChild):
    """Socket, database and log in `tmp_path`; no GPU probe; the scheduling
    backend `sched_backend` ("none" unless given); no CPU sampler unless
    `extra_args` holds --cpu-sampler (it needs root and takes ~3 s to load), no
    CUDA driver probe unless it holds --cuda-driver;
    `extra_args` appended."""

    def __init__(
        self, tmp_path, sched_backend="none", extra_args=(), preamble=None, fresh_file=False
    ):
        super().__init__(
            tmp_path / "probe.sock",
            tmp_path / "test.duckdb",
            tmp_path / "daemon.log",
            preamble=preamble,
        )
        self.dir = tmp_path
        self.fresh_file = fresh_file
        self.sched_backend = sched_backend
        self.extra_args = list(extra_args)

    def daemon_args(self):
        args = ["--socket", self.socket, "--db", self.db, "--gpu-backend", "none"]
        if self.sched_backend:
            args += ["--sched-backend", self.sched_backend]
        if self.sched_backend == "none" and "--kernel-causes" not in self.extra_args:
            # no kernel probes at all unless a test asks (they need root and
            # take ~1 s to load)
            args += ["--no-kernel-causes"]
        if "--cpu-sampler" not in self.extra_args:
            args += ["--no-cpu-sampler"]
        elif not any(a.startswith("--cpu-sample-clock") for a in self.extra_args):
            # The clock the sampler's tests count samples by; "auto" (the
            # default, host-dependent) has tests of its own (test_cpu_clock.py).
            args += ["--cpu-sample-clock", "timer"]
        if "--cuda-driver" not in self.extra_args:
            args += ["--no-cuda-driver"]  # a bcc program to load: only where a test asks
        return args + self.extra_args

    def command(self):
        cmd = super().command()
        cmd[0] = DAEMON_PYTHON
        return cmd

    def start(self, wait=True, timeout_s=30):
        # only into a folder that exists: one the daemon makes is part of
        # what some tests check (its mode)
        if (
            not self.fresh_file
            and not os.path.exists(self.db)
            and os.path.isdir(os.path.dirname(os.path.abspath(self.db)))
        ):
            try:
                from helpers.schema_db import copy_template
            except ImportError:  # no duckdb here (tests/pythons/): the daemon's Python makes it
                shutil.copyfile(_foreign_template(), self.db)
            else:
                copy_template(self.db)
        return super().start(wait=wait, timeout_s=timeout_s)

    def query(self, sql, params=None):
        try:
            import duckdb  # noqa: F401
        except ImportError:
            pass
        else:
            return super().query(sql, params)
        out = subprocess.run(
            [DAEMON_PYTHON, "-c", _QUERY, self.db, sql, json.dumps(list(params or []))],
            capture_output=True,
            text=True,
            check=True,
        )
        return [tuple(row) for row in json.loads(out.stdout)]
