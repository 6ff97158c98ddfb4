"""The API from Node.js: tests/node/api.test.mjs (@grpc/grpc-js, @grpc/proto-loader
from npm) against a real daemon while a real engine emits steps.

The engine makes ~1 us steps (the sub-microsecond spans that used to flood
alerts) with a 5 ms stall every 3,000 steps, ~10k steps/s, and a request
every 100 steps (arrived, 4 tokens of 2, finished), until the suite ends. Skipped when node or the suite's npm modules are missing (the
bootstrap runs `npm ci` in tests/node when npm exists); with
STALLSCOPE_REQUIRE_NODE=1 (set by .ci/run) that skip is a failure.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.api import start_api_daemon, stop

pytestmark = pytest.mark.daemon

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tests" / "node"
REQUIRE_NODE = os.environ.get("STALLSCOPE_REQUIRE_NODE") == "1"
LABEL = "node-engine"

ENGINE = """
import sys, time
import probe_client
probe = probe_client.connect(socket_path=sys.argv[1], run_label=sys.argv[2], gc=False)
i = 0
while True:
    t0 = probe.begin()
    if i % 3000 == 2999:
        time.sleep(0.005)
    k = i % 100  # a request every 100 steps: arrives, 4 tokens of 2, finishes
    if k == 0:
        probe.request(f"req-{i // 100}", "arrived")
    elif k <= 4:
        probe.request(f"req-{i // 100}", "token", tokens=2)
    elif k == 5:
        probe.request(f"req-{i // 100}", "finished")
    probe.end("step", t0, stage="tight", batch=1)
    i += 1
    if i % 100 == 0:
        time.sleep(0.01)
"""


def _node():
    node = shutil.which("node")
    missing = None
    if node is None:
        missing = "node is not installed (Debian: nodejs; Node 20 or later)"
    elif not (SUITE / "node_modules" / "@grpc" / "grpc-js").is_dir():
        missing = f"the suite's npm modules are missing: run `npm ci` in {SUITE}"
    if missing:
        if REQUIRE_NODE:
            pytest.fail(f"STALLSCOPE_REQUIRE_NODE=1 but {missing}")
        pytest.skip(missing)
    return node


def test_node_client_suite(tmp_path):
    node = _node()
    d = start_api_daemon(tmp_path)
    engine = subprocess.Popen([sys.executable, "-c", ENGINE, d.socket, LABEL])
    try:
        env = dict(
            os.environ,
            STALLSCOPE_API_SOCKET=d.api_socket,
            STALLSCOPE_PROTO_ROOT=str(ROOT / "protos"),
            STALLSCOPE_RUN_LABEL=LABEL,
        )
        out = subprocess.run(
            [node, "--test", "--test-reporter=spec", str(SUITE / "api.test.mjs")],
            cwd=SUITE,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert engine.poll() is None, "the engine died during the suite"
        assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
        assert "# fail 0" in out.stdout or "fail 0" in out.stdout, out.stdout[-3000:]
    finally:
        engine.kill()
        engine.wait()
        stop(d)
