"""The probes follow a client's process before the daemon says it connected.

Whoever waits for the "run N: pid P uid U connected" line (a user, a test,
a script that starts its work then) must get a process whose switches the
kernel probes already see: logged before `on_track`, the sched probe missed
a new thread's first switches 1 run in 4 (tests/probes/test_sched_summary.py
waits for that line). A real Ingest on a real Unix socket and a real store.
"""

import logging
import socket

from probe_client import wire
from stallscope.ingest.listener import Ingest
from stallscope.store.database import Store

HELLO = wire.HEADER.pack(wire.MAGIC, 1, wire.DGRAM_HELLO, 0, 32, 0, 1, 0, 0) + b"{}"


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_connected_is_logged_after_the_probes_follow_the_pid(tmp_path):
    lines = Lines()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(lines)
    root.setLevel(logging.INFO)
    store = Store(str(tmp_path / "t.duckdb"))
    tracked = []  # (pid, run_id, lines logged when on_track was called)
    ing = Ingest(
        store,
        socket_path=str(tmp_path / "p.sock"),
        on_track=lambda pid, run_id=None: tracked.append((pid, run_id, list(lines.lines))),
    )
    client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        client.connect(str(tmp_path / "p.sock"))
        client.send(HELLO)
        for _ in range(200):
            ing.poll(0.01)
            if any("connected" in line for line in lines.lines):
                break
        connected = [line for line in lines.lines if " connected (" in line]
        assert len(connected) == 1, lines.lines
        assert len(tracked) == 1
        pid, run_id, before = tracked[0]
        assert connected[0].startswith(f"run {run_id}: pid {pid} uid ")
        assert not any(" connected (" in line for line in before), before
    finally:
        root.removeHandler(lines)
        root.setLevel(old_level)
        client.close()
        ing.close()
        store.close()
