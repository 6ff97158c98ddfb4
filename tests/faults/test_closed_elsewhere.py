"""A client's socket closed behind the listener's back: the daemon serves on.

Something else in the daemon process closing a descriptor it does not own
(bcc < 0.33's symbolizer did, cpu_stacks.py) frees the number of a live
client's socket; the next accept gets it while the listener still holds it
registered, and the selector refused the new socket (KeyError): the daemon
died. Here a real Ingest on a real Unix socket and a real store sees that
happen: the old connection's run ends with an `ingest_errors` row, the new
connection is served on the same number, and the old socket object never
closes it.
"""

import os
import socket

import pytest

from probe_client import wire
from stallscope.ingest.listener import Ingest
from stallscope.store.database import Store

pytestmark = pytest.mark.faults

HELLO = wire.HEADER.pack(wire.MAGIC, 1, wire.DGRAM_HELLO, 0, 32, 0, 1, 0, 0) + b"{}"


def _poll_until(ing, cond, rounds=200):
    for _ in range(rounds):
        ing.poll(0.01)
        if cond():
            return True
    return False


def test_a_socket_closed_elsewhere_ends_its_run_and_the_next_client_is_served(tmp_path):
    store = Store(str(tmp_path / "t.duckdb"))
    ended = []
    ing = Ingest(store, socket_path=str(tmp_path / "p.sock"), on_run_end=ended.append)
    fillers, clients = [], []
    try:
        a = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        clients.append(a)
        a.connect(str(tmp_path / "p.sock"))
        a.send(HELLO)
        assert _poll_until(ing, lambda: any(c.run for c in ing.conns.values()))
        (fd, old), *_ = ing.conns.items()
        run_a = old.run.run_id
        b = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # (its own number first)
        clients.append(b)
        os.close(fd)  # a stray close elsewhere in the process
        # the next accept must get that number: take every free one below it
        while (n := os.open(os.devnull, os.O_RDONLY)) != fd:
            fillers.append(n)
        os.close(fd)
        b.connect(str(tmp_path / "p.sock"))
        b.send(HELLO)
        old_run = old.run
        assert _poll_until(
            ing, lambda: getattr(ing.conns.get(fd), "run", None) not in (None, old_run)
        )
        new = ing.conns[fd]
        assert new is not old and new.run.run_id != run_a
        assert run_a in ended
        assert old.sock.fileno() == -1  # detached, not closed: the number is b's
        assert ing.rejections["socket_closed_elsewhere"] == 1
        # b's socket still works on that number after the old object let go
        old = None
        b.send(HELLO)  # a second HELLO on a run: a counted rejection, read from b
        assert _poll_until(ing, lambda: ing.rejections["duplicate_hello"] == 1)
        ing.decode_pending()
        store.flush()
        cur = store.cursor()
        rows = cur.execute(
            "SELECT run_id, sum(count)::BIGINT FROM ingest_errors "
            "WHERE reason = 'socket_closed_elsewhere' GROUP BY ALL"
        ).fetchall()
        cur.close()
        assert rows == [(run_a, 1)], rows
    finally:
        for n in fillers:
            os.close(n)
        for c in clients:
            c.close()
        ing.close()
        store.close()
