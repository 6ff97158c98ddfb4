"""Socket activation: LISTEN_FDS parsing, and a real daemon started by
`systemd-socket-activate --seqpacket` that serves a probe client through the
descriptor it was handed, stores its records, and leaves the socket file
(which belongs to the activator) in place."""

import os
import socket
import sys
import time

import pytest

import probe_client
from helpers.systemd import NotifyListener, ServiceProcess, have
from stallscope.service.systemd import activation

pytestmark = [
    pytest.mark.skipif(
        not have("systemd-socket-activate"),
        reason="needs systemd-socket-activate (Debian package systemd)",
    ),
    pytest.mark.daemon,
]

NO_PROBES = '[probes]\nsched_backend = "none"\ngpu_backend = "none"\n'


def activated(tmp_path, extra=(), env=None):
    """A ServiceProcess whose probe socket comes from systemd-socket-activate."""
    sock_path = str(tmp_path / "activated.sock")
    svc = ServiceProcess(
        tmp_path,
        NO_PROBES,
        env=env,
        prefix=[
            "systemd-socket-activate",
            *extra,
            "-l",
            sock_path,
            "-E",
            "PYTHONPATH",
            "-E",
            "NOTIFY_SOCKET",
            "-E",
            "STALLSCOPE_CONFIG",
        ],
    )
    svc.socket_from_activator = sock_path
    # --socket points elsewhere on purpose: the inherited descriptor must win.
    svc.socket = str(tmp_path / "not-used.sock")
    return svc


def wait_path(path, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_probe_client_through_activated_seqpacket_socket(tmp_path):
    lst = NotifyListener(path=tmp_path / "notify.sock")
    svc = activated(
        tmp_path, extra=["--seqpacket", "--fdname=probe"], env={"NOTIFY_SOCKET": lst.address}
    )
    svc.start()
    try:
        wait_path(svc.socket_from_activator)
        # The first connection is what starts the daemon (as with systemd's .socket).
        probe = probe_client.connect(
            socket_path=svc.socket_from_activator, run_label="activated", gc=False
        )
        n = 2000
        for i in range(n):
            t0 = probe.begin()
            probe.end("step", t0, stage="recurrent", batch=i % 5)
        lst.wait_for("READY", "1")
        probe.close()
        assert probe.stats()["sent_records"] == n
        svc.wait_log("probe socket from systemd: fd 3")
        time.sleep(0.5)  # let the daemon read what is queued before SIGTERM
        assert svc.stop() == 0
    finally:
        svc.kill()
        lst.close()
    log = svc.read_log()
    assert "listening on inherited socket" in log
    assert not os.path.exists(svc.socket), "the daemon bound its own socket instead"
    # The socket file is the activator's: the daemon must not remove it.
    assert os.path.exists(svc.socket_from_activator)
    assert svc.query("SELECT label, records, pid FROM runs") == [("activated", n, os.getpid())]
    assert svc.query("SELECT count(*) FROM spans")[0][0] == n


def test_stream_socket_is_refused_with_the_fix(tmp_path):
    svc = activated(tmp_path, extra=["--fdname=probe"])  # SOCK_STREAM
    svc.start()
    try:
        wait_path(svc.socket_from_activator)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(svc.socket_from_activator)
        rc = svc.proc.wait(timeout=30)
        s.close()
    finally:
        svc.kill()
    assert rc != 0
    assert "not SOCK_SEQPACKET" in svc.read_log()
    assert "ListenSequentialPacket=" in svc.read_log()


def test_listen_fds_parsing():
    me = str(os.getpid())
    # A child puts real sockets at descriptors 3 and 4, as the manager does.
    code = (
        "import os, socket, json\n"
        "a = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "b = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "os.dup2(a.fileno(), 3); os.dup2(b.fileno(), 4)\n"
        "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='2', LISTEN_FDNAMES='probe:api')\n"
        "from stallscope.service.systemd import activation as act\n"
        "fds = act.listen_fds()\n"
        "print(json.dumps([fds, act.pick(fds, 'probe'), 'LISTEN_FDS' in os.environ,"
        " os.get_inheritable(3)]))\n"
    )
    import json
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    fds, probe_fd, still_set, inheritable = json.loads(out.stdout)
    assert fds == {"probe": [3], "api": [4]}
    assert probe_fd == 3
    assert still_set is False and inheritable is False
    # Meant for another process, or not activated at all: nothing.
    assert activation.listen_fds({"LISTEN_PID": "1", "LISTEN_FDS": "1"}) == {}
    assert activation.listen_fds({}) == {}
    with pytest.raises(activation.ActivationError):
        activation.listen_fds({"LISTEN_PID": me, "LISTEN_FDS": "x"})
