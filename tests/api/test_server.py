"""The API's endpoints: Unix socket mode, health and reflection, TCP only with TLS."""

import re
import shutil
import stat
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from helpers.api import start_api_daemon, stop
from helpers.daemonproc import DaemonProcess
from stallscope.api.client import ApiError, Client

pytestmark = pytest.mark.daemon


def test_unix_socket_is_0660_and_serves_health_and_reflection(api_daemon, client):
    mode = stat.S_IMODE(__import__("os").stat(api_daemon.api_socket).st_mode)
    assert mode == 0o660
    health = health_pb2_grpc.HealthStub(client.channel)
    for service in ("", "stallscope.v1.Stallscope"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(client.channel)
    answers = list(
        refl.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
    )
    names = {s.name for s in answers[0].list_services_response.service}
    assert {"stallscope.v1.Stallscope", "grpc.health.v1.Health"} <= names
    stop(api_daemon)
    assert not __import__("os").path.exists(api_daemon.api_socket)


def _run_daemon_expecting_refusal(tmp_path, args):
    d = DaemonProcess(tmp_path, extra_args=args)
    d.start(wait=False)
    rc = d.proc.wait(timeout=60)
    d._logf.close()
    return rc, d.read_log()


def test_tcp_without_tls_is_refused(tmp_path):
    rc, log = _run_daemon_expecting_refusal(tmp_path, ["--grpc-listen", "127.0.0.1:0"])
    assert rc == 2
    assert "refusing to serve the API on TCP 127.0.0.1:0 without TLS" in log
    assert "--tls-cert" in log and "Traceback" not in log
    rc, log = _run_daemon_expecting_refusal(
        tmp_path, ["--grpc-listen", "127.0.0.1:0", "--tls-cert", str(tmp_path / "c.pem")]
    )
    assert rc == 2 and "without TLS" in log


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1, and a client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=stallscope test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        cwd=d,
    )
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            cwd=d,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            f"{name}.pem",
            cwd=d,
        )
    # and a self-signed server certificate, no CA at all
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=localhost",
        "-addext",
        "subjectAltName=IP:127.0.0.1",
        "-keyout",
        "self.key",
        "-out",
        "self.pem",
        cwd=d,
    )
    return d


def _tcp_port(d):
    m = re.search(r"tcp 127\.0\.0\.1:(\d+) \(TLS", d.read_log())
    assert m, d.read_log()
    return int(m.group(1))


def test_tls_with_a_self_signed_certificate(tmp_path, pki):
    d = start_api_daemon(
        tmp_path,
        [
            "--grpc-listen",
            "127.0.0.1:0",
            "--tls-cert",
            str(pki / "self.pem"),
            "--tls-key",
            str(pki / "self.key"),
        ],
    )
    try:
        target = f"127.0.0.1:{_tcp_port(d)}"
        c = Client(target=target, tls_ca=str(pki / "self.pem"))
        c.wait_ready()
        assert c.status().daemon_pid == d.proc.pid
        assert c.query("SELECT 1 + 1")[1] == [(2,)]
        c.close()
        # plain text to the TLS port gets nothing
        plain = Client(target=target)
        with pytest.raises(ApiError) as info:
            plain.status()
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
        plain.close()
        # the Unix socket still works alongside
        u = Client(d.api_socket)
        assert u.status().daemon_pid == d.proc.pid
        u.close()
    finally:
        stop(d)


def test_mutual_tls_requires_a_client_certificate(tmp_path, pki):
    d = start_api_daemon(
        tmp_path,
        [
            "--grpc-listen",
            "127.0.0.1:0",
            "--tls-cert",
            str(pki / "server.pem"),
            "--tls-key",
            str(pki / "server.key"),
            "--tls-client-ca",
            str(pki / "ca.pem"),
        ],
    )
    try:
        target = f"127.0.0.1:{_tcp_port(d)}"
        anonymous = Client(target=target, tls_ca=str(pki / "ca.pem"))
        with pytest.raises(ApiError):
            anonymous.status()
        anonymous.close()
        c = Client(
            target=target,
            tls_ca=str(pki / "ca.pem"),
            tls_cert=str(pki / "client.pem"),
            tls_key=str(pki / "client.key"),
        )
        assert c.status().daemon_pid == d.proc.pid
        c.close()
    finally:
        stop(d)


def test_top_without_a_daemon_says_so(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "stallscope.cli",
            "top",
            "--api-socket",
            str(tmp_path / "none.sock"),
            "--duration",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("error: ") and "Traceback" not in out.stderr
