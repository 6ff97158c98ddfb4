"""sd_notify against a real NOTIFY_SOCKET listener and a real daemon process:
READY after the probe socket is bound, STATUS naming the probes, WATCHDOG=1 at
half of WATCHDOG_USEC, STOPPING=1 on SIGTERM; the abstract namespace too."""

import os
import signal
import socket
import statistics
import time
import uuid
from itertools import pairwise

import pytest

from helpers.systemd import NotifyListener, ServiceProcess, proc_backend_available
from stallscope.service.systemd import notify as notifymod

pytestmark = pytest.mark.daemon

NO_PROBES = '[probes]\nsched_backend = "none"\ngpu_backend = "none"\n'


@pytest.fixture
def listener(tmp_path):
    lst = NotifyListener(path=tmp_path / "notify.sock")
    yield lst
    lst.close()


def test_ready_after_bind_status_and_stopping(tmp_path, listener):
    config = NO_PROBES
    expect_probe = "probes: none"
    if proc_backend_available():  # after the sched probe is merged: a real active probe
        config = '[probes]\nsched_backend = "proc"\ngpu_backend = "none"\n'
        expect_probe = "sched=proc"
    svc = ServiceProcess(tmp_path, config, env={"NOTIFY_SOCKET": listener.address}).start()
    try:
        i = listener.wait_for("READY", "1")
        # READY means the probe socket accepts connections at this very moment.
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(svc.socket)
        s.close()
        ready = listener.messages[i][1]
        assert expect_probe in ready["STATUS"], ready
        assert ready["MAINPID"] == str(svc.proc.pid)
        assert not any("STOPPING" in m for _, m in listener.messages)
        svc.signal(signal.SIGTERM)
        j = listener.wait_for("STOPPING", "1", after=i)
        assert svc.proc.wait(timeout=20) == 0
        assert j > i
    finally:
        svc.kill()


def test_watchdog_pings_at_half_the_interval(tmp_path, listener):
    watchdog_usec = 2_000_000  # pings expected every 1 s
    svc = ServiceProcess(
        tmp_path,
        NO_PROBES,
        env={"NOTIFY_SOCKET": listener.address, "WATCHDOG_USEC": str(watchdog_usec)},
    ).start()
    try:
        listener.wait_for("READY", "1")
        time.sleep(4.5)
        pings = listener.times("WATCHDOG")
    finally:
        assert svc.stop() == 0
    gaps = [b - a for a, b in pairwise(pings)]
    assert len(pings) >= 4, pings
    # Never later than the manager's deadline, and not every loop tick either.
    assert max(gaps) < watchdog_usec / 1e6, gaps
    assert min(gaps) > 0.5, gaps
    assert 0.8 < statistics.median(gaps) < 1.9, gaps


def test_no_watchdog_pings_for_another_pid(tmp_path, listener):
    svc = ServiceProcess(
        tmp_path,
        NO_PROBES,
        env={"NOTIFY_SOCKET": listener.address, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"},
    ).start()
    try:
        listener.wait_for("READY", "1")
        time.sleep(1.0)
    finally:
        assert svc.stop() == 0
    assert listener.times("WATCHDOG") == []


def test_abstract_notify_socket(tmp_path):
    name = f"stallscope-test-{uuid.uuid4().hex}"
    lst = NotifyListener(abstract=name)
    svc = ServiceProcess(tmp_path, NO_PROBES, env={"NOTIFY_SOCKET": "@" + name}).start()
    try:
        lst.wait_for("READY", "1")
        assert svc.stop() == 0
        lst.wait_for("STOPPING", "1")
    finally:
        svc.kill()
        lst.close()


def test_notifier_without_socket_is_silent():
    n = notifymod.Notifier(environ={})
    assert not n.enabled
    assert n.send("READY=1") is False


def test_watchdog_interval_parsing():
    assert notifymod.watchdog_interval_s({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert (
        notifymod.watchdog_interval_s(
            {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}
        )
        == 15.0
    )
    assert notifymod.watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert notifymod.watchdog_interval_s({}) is None
    assert notifymod.watchdog_interval_s({"WATCHDOG_USEC": "junk"}) is None
