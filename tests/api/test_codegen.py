"""Generated gRPC code is exactly what scripts/gen_protos.sh makes from the proto."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GEN_DIR = Path("daemon") / "stallscope" / "api" / "v1"
GENERATED = ("stallscope_pb2.py", "stallscope_pb2.pyi", "stallscope_pb2_grpc.py")


def _gen(root, *args):
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(
        [str(root / "scripts" / "gen_protos.sh"), *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_committed_generated_code_is_fresh():
    out = _gen(ROOT, "--check")
    assert out.returncode == 0, out.stderr


def test_a_changed_proto_is_caught_and_regenerated(tmp_path):
    """In a copy: edit the proto; --check fails and names the files; generating fixes it."""
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "gen_protos.sh", copy / "scripts")
    shutil.copytree(ROOT / "protos", copy / "protos")
    (copy / GEN_DIR).mkdir(parents=True)
    for name in GENERATED:
        shutil.copy2(ROOT / GEN_DIR / name, copy / GEN_DIR / name)
    assert _gen(copy, "--check").returncode == 0
    proto = copy / "protos" / "stallscope" / "api" / "v1" / "stallscope.proto"
    proto.write_text(
        proto.read_text().replace(
            "message GetStatusRequest {}", "message GetStatusRequest { bool verbose = 1; }"
        )
    )
    out = _gen(copy, "--check")
    assert out.returncode == 1 and "stale" in out.stderr and "stallscope_pb2.py" in out.stderr
    assert _gen(copy, "--if-stale").returncode == 0
    assert "verbose" in (copy / GEN_DIR / "stallscope_pb2.pyi").read_text()
    assert _gen(copy, "--check").returncode == 0
    grpc_module = (copy / GEN_DIR / "stallscope_pb2_grpc.py").read_text()
    assert "from stallscope.api.v1 import stallscope_pb2 as" in grpc_module
