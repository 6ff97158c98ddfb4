"""A stop at any phase of start-up loses nothing a client sent.

The daemon handles SIGTERM from its first moment (service/systemd/stopping.py) and
creates its probe socket only once its probes are ready. For SIGTERMs sent at
increasing delays after the daemon was started (while it imports, opens the
database, compiles and loads its eBPF programs, and right after its socket
appears) with a client that writes 1,000 spans as soon as it can connect,
the daemon exits 0 and every record the client sent is stored or reported
lost. With root the sched probe is bcc, whose compile makes the window wide.
"""

import json
import os
import selectors
import signal
import subprocess
import sys
import time

import pytest

from helpers.faults import Daemon

pytestmark = pytest.mark.daemon

CLIENT = r"""
import json, os, sys, time
import probe_client
sock, n = sys.argv[1], int(sys.argv[2])
while not os.path.exists(sock):
    time.sleep(0.001)
probe = probe_client.connect(socket_path=sock, run_label="startup", gc=False)
for _ in range(n):
    probe.end("step", probe.begin(), batch=1)
deadline = time.monotonic() + 2
while probe.stats()["sent_records"] < probe.stats()["next_seq"] and time.monotonic() < deadline:
    time.sleep(0.005)
print(json.dumps(probe.stats()), flush=True)
time.sleep(60)  # stays connected, as an engine does, until the test ends it
"""

N_SPANS = 1000
# Seconds after the daemon was started; "socket" = right after the client
# reports its records sent (the case: stop as soon as clients wrote).
PHASES = [0.0, 0.03, 0.1, 0.3, 0.8, 1.5, "socket"]


def _phase_id(p):
    return p if isinstance(p, str) else f"{int(p * 1000)}ms"


@pytest.mark.parametrize("phase", PHASES, ids=_phase_id)
def test_sigterm_during_startup_stores_or_reports_every_sent_record(tmp_path, phase, figures):
    backend = "bcc" if os.geteuid() == 0 else "none"
    d = Daemon(tmp_path, sched_backend=backend)
    d.start(wait=False)
    t_start = time.monotonic()
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, d.socket, str(N_SPANS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stats = None
        if phase == "socket":
            line = client.stdout.readline()  # blocks until the client sent everything
            assert line, client.stderr.read()
            stats = json.loads(line)
        else:
            time.sleep(max(0.0, phase - (time.monotonic() - t_start)))
        t_term = time.monotonic() - t_start
        socket_seen = os.path.exists(d.socket)
        d.proc.send_signal(signal.SIGTERM)
        rc = d.proc.wait(timeout=60)
        if stats is None:
            # The client may have connected and sent before the stop: its line
            # comes within its own 2 s bound, or never if it never connected.
            if client.poll() is None:
                sel = selectors.DefaultSelector()
                sel.register(client.stdout, selectors.EVENT_READ)
                if sel.select(timeout=3):
                    line = client.stdout.readline()
                    stats = json.loads(line) if line else None
    finally:
        client.kill()
        client.wait()
    log = d.read_log()
    # Python's default SIGTERM action applies only before the first line of
    # the command ran, when no socket existed and nothing was accepted.
    if rc != 0:
        assert rc == -signal.SIGTERM and not socket_seen and not log.strip(), (rc, log)
    stored = lost = 0
    if stats is not None and stats["sent_records"] > 0:
        assert rc == 0, log
        stored = d.scalar(
            "SELECT count(*) FROM spans JOIN runs USING (run_id) WHERE runs.label = 'startup'"
        )
        lost = d.scalar(
            "SELECT coalesce(sum(count), 0)::BIGINT FROM losses JOIN runs USING (run_id) "
            "WHERE runs.label = 'startup'"
        )
        assert stored + lost >= stats["sent_records"], (stats, stored, lost, log)
        assert stored + lost <= stats["next_seq"]
    if phase == "socket":
        assert stored == N_SPANS, (stored, lost, log)
    figures.update(
        phase=_phase_id(phase),
        backend=backend,
        sigterm_at_s=round(t_term, 3),
        exit_status=rc,
        socket_existed=socket_seen,
        client_sent=stats["sent_records"] if stats else 0,
        stored=stored,
        reported_lost=lost,
    )


def test_sigusr2_writes_every_threads_stack_and_changes_nothing(tmp_path):
    """`systemctl kill -s USR2`: every thread's Python stack in the log (the
    main loop's and the writer's among them), then the daemon goes on
    storing and stops with status 0."""
    import probe_client
    from helpers.daemonproc import DaemonProcess

    d = DaemonProcess(tmp_path).start()
    try:
        d.proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while "Current thread" not in d.new_log() and time.monotonic() < deadline:
            time.sleep(0.05)
        dump = d.new_log()
        assert "Current thread" in dump and dump.count("Thread 0x") >= 2, dump
        assert "server.py" in dump and "store" in dump, dump
        p = probe_client.connect(socket_path=d.socket, gc=False)
        for _ in range(5):
            p.end("step", p.begin())
        p.close()
        rc, _ = d.stop()
        assert rc == 0, d.read_log()
        assert d.query("SELECT count(*) FROM spans") == [(5,)]
    finally:
        if d.proc.poll() is None:
            d.kill()
