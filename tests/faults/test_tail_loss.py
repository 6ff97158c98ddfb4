"""A malformed flood next to a good client: every record stored or reported lost.

One process floods the daemon with ~16,000 malformed datagrams (CI and full
size alike: the figure is the issue's) while a well-behaved client makes
5,000 step spans and exits right after its last one. Records the client made
= records stored + records in `losses`, exactly, the tail included: close()
waits (bounded) for socket space so the last records and the BYE land, the
BYE's sequence number turns any records still dropped at close into a loss
row, and the daemon reads the good client's connection every round however
much the flood sends. The flood's short connections keep the daemon's listen
backlog full most of the time: the good client's connect() is refused with
EAGAIN until it finds room, and retries after 10 ms each time (a client that
waited the usual second per try once missed the daemon for its whole run).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers.faults import Daemon, reconcile
from helpers.waiting import wait_for

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = [pytest.mark.faults, pytest.mark.daemon]

FLOOD = f"{HERE}/floodproc.py"
TAIL = f"{HERE}/tailclient.py"


@pytest.mark.parametrize("round_", range(2))
def test_flood_and_good_client_reconcile_exactly_tail_included(tmp_path, figures, round_):
    d = Daemon(tmp_path).start()
    ready = str(tmp_path / "flood.ready")
    try:
        flood = subprocess.Popen(
            [sys.executable, FLOOD, d.socket, "16000", "--ready", ready],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert wait_for(lambda: flood.poll() is not None or os.path.exists(ready))
        good = subprocess.Popen(
            [sys.executable, TAIL, d.socket, "1667", "1.5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = good.communicate(timeout=120)
        assert good.returncode == 0, err
        stats = json.loads(out.strip().splitlines()[-1])
        fout, ferr = flood.communicate(timeout=120)
        assert flood.returncode == 0, ferr
        flood_stats = json.loads(fout.strip().splitlines()[-1])
        assert d.proc.poll() is None
        assert d.stop(timeout_s=60)[0] == 0
    finally:
        for p in ("flood", "good"):
            proc = locals().get(p)
            if proc is not None and proc.poll() is None:
                proc.kill()
        if d.proc.poll() is None:
            d.proc.kill()
    (g,) = reconcile(d, [stats])
    assert g["made"] == 3 * 1667
    assert g["stored"] + g["lost"] == g["made"], g
    assert g["duplicates"] == 0, g
    tail_lost = d.scalar(
        "SELECT coalesce(sum(count), 0)::BIGINT FROM losses WHERE run_id = ? "
        "AND reason = 'client_tail'",
        [g["run_id"]],
    )
    rejected = d.scalar("SELECT coalesce(sum(count), 0)::BIGINT FROM ingest_errors")
    figures.update(
        round=round_,
        flood_sent=flood_stats["sent"],
        rejected=rejected,
        made=g["made"],
        stored=g["stored"],
        reported_lost=g["lost"],
        tail_lost=tail_lost,
        client_drops_full=g["drops_full"],
        # before it got in: tries the daemon's full backlog refused (retried
        # after 10 ms each) and the records made meanwhile (reported lost)
        client_connect_busy=stats["connect_busy"],
        client_drops_disconnected=stats["drops_disconnected"],
    )


def _paused_at_mark(d, mark, steps, seconds, extra, how, close_wait_ms):
    """The tail client started (`--exit`: no close(), the exit hook closes),
    and the daemon stopped (SIGSTOP) once half its steps are made; the
    caller sends SIGCONT."""
    good = subprocess.Popen(
        [sys.executable, TAIL, d.socket, steps, seconds, "--mark", "0.5", mark]
        + extra
        + (["--exit"] if how == "exit" else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "STALLSCOPE_CLOSE_WAIT_MS": str(close_wait_ms)},
    )
    try:
        assert wait_for(lambda: os.path.exists(mark), timeout_s=60)
    except BaseException:
        good.kill()
        raise
    d.proc.send_signal(signal.SIGSTOP)
    return good


@pytest.mark.parametrize("how", ["close", "exit"])
def test_daemon_paused_at_client_exit_tail_is_stored_or_reported(tmp_path, figures, how):
    """The daemon stops reading (SIGSTOP) for the last part of a client's run
    and until after the client began to close: the client's socket fills,
    its final records wait in close(), and the BYE lands once the daemon
    resumes. Made = stored + reported lost, with the drops reported."""
    d = Daemon(tmp_path).start()
    mark, closing = str(tmp_path / "mark"), str(tmp_path / "closing")
    good = None
    try:
        good = _paused_at_mark(d, mark, "5000", "1.5", ["--closing", closing], how, 20000)
        try:
            assert wait_for(lambda: os.path.exists(closing), timeout_s=60)
            time.sleep(0.3)  # the client is inside close(), waiting for space
        finally:
            d.proc.send_signal(signal.SIGCONT)
        out, err = good.communicate(timeout=120)
        assert good.returncode == 0, err
        stats = json.loads(out.strip().splitlines()[-1])
        assert d.stop(timeout_s=60)[0] == 0
    finally:
        if good is not None and good.poll() is None:
            good.kill()
        if d.proc.poll() is None:
            d.proc.kill()
    (g,) = reconcile(d, [stats])
    assert g["made"] == 3 * 5000
    assert g["drops_full"] > 0, g  # the pause did fill the socket
    assert g["stored"] + g["lost"] == g["made"], g
    figures.update(how=how, made=g["made"], stored=g["stored"], reported_lost=g["lost"])


@pytest.mark.parametrize("how", ["close", "exit", "killed"])
def test_tail_without_bye_is_reported_from_the_tally_page(tmp_path, figures, how):
    """The daemon stays stopped (SIGSTOP) until after the client has gone:
    its close() waits 50 ms for socket space, then drops the rest and its
    BYE does not fit either (or, `killed`, SIGKILL ends it without a
    close). No BYE says how many records followed the last datagram; the
    tally page the HELLO passed does (a memfd the client keeps its next
    sequence number in), and the daemon reads it when the connection ends.
    Made = stored + reported lost, exactly; without the page the tail was
    lost unreported (stored + lost < made)."""
    d = Daemon(tmp_path).start()
    mark = str(tmp_path / "mark")
    good = None
    try:
        # killed: 10,000 steps over 3 s, so it still runs 1 s after the pause
        # began, its socket full after ~0.6 s of it (~46 datagrams)
        steps, seconds = ("10000", "3.0") if how == "killed" else ("5000", "1.5")
        good = _paused_at_mark(d, mark, steps, seconds, [], how, 50)
        try:
            if how == "killed":
                time.sleep(1.0)  # its socket fills, then it dies mid-run
                good.kill()
                good.wait(timeout=60)
                stats = None
            else:
                out, err = good.communicate(timeout=120)
                assert good.returncode == 0, err
                stats = json.loads(out.strip().splitlines()[-1])
        finally:
            d.proc.send_signal(signal.SIGCONT)
        if stats is not None:
            assert stats["drops_full"] > 0, stats  # the pause did fill the socket
        assert d.stop(timeout_s=60)[0] == 0
    finally:
        if good is not None and good.poll() is None:
            good.kill()
        if d.proc.poll() is None:
            d.proc.kill()
    tail = d.scalar(
        "SELECT coalesce(sum(count), 0)::BIGINT FROM losses WHERE reason = 'client_tail'"
    )
    if stats is None:
        # killed: what it made is unknown here, but every numbered record is
        # stored or lost, and the tail after the last datagram is counted
        (run_id,) = d.query("SELECT run_id FROM runs WHERE pid = ?", [good.pid])[0]
        stored = d.scalar("SELECT count(*) FROM spans WHERE run_id = ?", [run_id])
        lost = d.scalar(
            "SELECT coalesce(sum(count), 0)::BIGINT FROM losses WHERE run_id = ?", [run_id]
        )
        last = d.scalar("SELECT last_seq FROM runs WHERE run_id = ?", [run_id])
        assert tail > 0 and stored > 0, (stored, lost, tail)
        assert stored + lost > last, (stored, lost, last)  # seq numbers start at 0
        figures.update(how=how, stored=stored, reported_lost=lost, tail_lost=tail)
        return
    (g,) = reconcile(d, [stats])
    assert g["made"] == 3 * 5000
    assert tail > 0, g  # the BYE did not land: the page said it
    assert g["stored"] + g["lost"] == g["made"], g
    figures.update(how=how, made=g["made"], stored=g["stored"], reported_lost=g["lost"],
                   tail_lost=tail)  # fmt: skip


def test_a_descriptor_that_is_not_a_tally_page_is_refused_and_the_run_goes_on(tmp_path):
    """A HELLO may pass one descriptor; anything but a client's tally memfd
    (a pipe, a memfd of another name, one too small) is closed at once and
    counted as `bad_tally`, and the run is served as any other."""
    import array
    import socket

    from probe_client import wire

    d = Daemon(tmp_path).start()
    header = wire.HEADER.pack(wire.MAGIC, wire.VERSION, wire.DGRAM_HELLO, 0, wire.RECORD_SIZE,
                              0, time.monotonic_ns(), 0, 0)  # fmt: skip
    r, w = os.pipe()
    other = os.memfd_create("not-a-tally")
    os.ftruncate(other, 4096)
    small = os.memfd_create(wire.TALLY_NAME)  # the right name, zero bytes long
    try:
        for i, fd in enumerate((r, other, small)):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(d.socket)
            hello = header + json.dumps({"run_token": 100 + i}).encode()
            fds = array.array("i", [fd])
            s.sendmsg([hello], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            s.send(wire.HEADER.pack(wire.MAGIC, wire.VERSION, wire.DGRAM_BYE, 0, wire.RECORD_SIZE,
                                    0, time.monotonic_ns(), 0, 0))  # fmt: skip
            s.recv(10)  # the daemon's end of the connection
            s.close()
        assert d.stop(timeout_s=60)[0] == 0
    finally:
        for fd in (r, w, other, small):
            os.close(fd)
        if d.proc.poll() is None:
            d.proc.kill()
    errors = dict(d.query("SELECT reason, sum(count) FROM ingest_errors GROUP BY ALL"))
    assert errors == {"bad_tally": 3}, errors
    assert d.scalar("SELECT count(*) FROM runs") == 3
