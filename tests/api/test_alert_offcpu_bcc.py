"""A live stall alert that names off-CPU time, with the real eBPF scheduling probe."""

import os
import threading
import time

import pytest

import probe_client
from helpers.api import start_api_daemon, stop
from helpers.privileged import require_privileged
from helpers.waiting import wait_for
from stallscope.api.client import Client
from stallscope.api.v1 import stallscope_pb2 as pb
from stallscope.probes.sched_bcc import BccSchedProbe

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]


def _busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_blocked_step_alert_carries_offcpu(tmp_path):
    reason = BccSchedProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    d = start_api_daemon(tmp_path, ["--sched-backend", "bcc"])
    try:
        assert "sched probe: using bcc" in d.read_log()
        c = Client(d.api_socket)
        c.wait_ready()
        stream = c.events(kinds=[pb.STALL_ALERT])
        alerts = []

        def read():
            try:
                for batch in stream:
                    alerts.extend(e.stall_alert for e in batch.events)
            except Exception:
                pass

        threading.Thread(target=read, daemon=True).start()
        assert wait_for(lambda: c.status().subscribers == 1)
        probe = probe_client.connect(socket_path=d.socket, run_label="offcpu", gc=False)
        time.sleep(0.5)  # the daemon follows this pid from hello on
        for _ in range(20):
            t0 = probe.begin()
            _busy(0.003)
            probe.end("step", t0, stage="recurrent", batch=1)
        t0 = probe.begin()
        _busy(0.003)
        time.sleep(0.03)  # blocked inside the step
        probe.end("step", t0, stage="recurrent", batch=1)
        probe.close()
        got = wait_for(lambda: [a for a in alerts if a.duration_ns > 25_000_000])
        stream.cancel()
        assert got, f"no alert for the blocked step: {alerts}"
        a = got[-1]
        assert a.tid == a.pid == os.getpid()
        assert a.offcpu_ns >= 20_000_000 and not a.offcpu_sampled
        assert a.offcpu_ns - a.preempted_ns >= 20_000_000
        assert a.cause == "blocked"
        c.close()
    finally:
        stop(d)
