"""Security: who may connect, whose pid is traced, what the daemon's files allow.

A client whose uid is not in `--allow-uid` is refused by SO_PEERCRED and the
refusal counted (the client runs as another uid, with the socket's group so
that the file mode lets it reach the socket); without the group the socket's
mode 0660 refuses it first. A client that claims another process's pid and
run token is traced as the pid the kernel reports and cannot write into the
other run. Nothing the daemon creates is world-writable; the database
directory it creates is not world-readable. The `Query` sandbox (no file or
network access) is tested with the gRPC API (shared with the gRPC suite).
"""

import json
import os
import shutil
import socket
import stat
import tempfile

import pytest

import probe_client
from helpers.faults import Daemon
from helpers.privileged import is_root, require_privileged
from probe_client import wire

pytestmark = [pytest.mark.faults, pytest.mark.daemon, pytest.mark.privileged]

NOBODY = 65534
OTHER = 65533


def _raw_client(path, claimed_pid, token, first_seq, n, bye=True):
    """Hello (claiming `claimed_pid` and `token`), n span records, BYE; the
    outcome as a dict. Raw socket: no probe thread to follow a fork."""
    out = {"uid": os.getuid(), "pid": os.getpid()}
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(path)
    except OSError as exc:
        out["connect_error"] = exc.errno
        return out
    s.settimeout(5)
    hello = json.dumps(
        {"run_token": token, "pid": claimed_pid, "label": "intruder" if os.getuid() else "victim"}
    ).encode()
    try:
        s.send(wire.HEADER.pack(wire.MAGIC, 1, wire.DGRAM_HELLO, 0, 32, first_seq, 1, 0, 0) + hello)
        body = b"".join(
            wire.RECORD.pack(wire.REC_SPAN, 0, 0, 1, 10 + i, 20 + i, 0, 0) for i in range(n)
        )
        s.send(
            wire.HEADER.pack(wire.MAGIC, 1, wire.DGRAM_RECORDS, n, 32, first_seq, 1, 0, 0) + body
        )
        if bye:
            s.send(wire.HEADER.pack(wire.MAGIC, 1, wire.DGRAM_BYE, 0, 32, first_seq + n, 1, 0, 0))
            out["recv"] = len(s.recv(100))  # 0: the daemon closed the connection
    except OSError as exc:
        out["io_error"] = exc.errno
    out["sock"] = s
    return out


def _as_user(uid, groups, *args):
    """_raw_client in a forked child that dropped to `uid` (no exec: the
    test's interpreter need not be readable by that uid)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups(groups)
            os.setgid(uid)
            os.setuid(uid)
            out = _raw_client(*args)
            out.pop("sock", None)
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.fixture
def shared_dir():
    """A socket directory other uids can traverse (pytest's tmp dirs are 0700)."""
    path = tempfile.mkdtemp(prefix="stallscope-sec-", dir="/tmp")
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_uid_not_allowed_is_refused_and_claims_are_ignored(tmp_path, shared_dir, figures):
    require_privileged(is_root(), "needs root (mount, setuid)")
    d = Daemon(tmp_path, extra_args=["--allow-uid", "0", "--allow-uid", str(OTHER)])
    d.socket = os.path.join(shared_dir, "probe.sock")
    d.start()
    try:
        sock_gid = os.stat(d.socket).st_gid
        token = 0x1234567890
        victim = _raw_client(d.socket, os.getpid(), token, 0, 500, bye=False)
        # 1. uid 65534 in the socket's group: reaches the socket, refused by uid.
        refused = [
            _as_user(NOBODY, [sock_gid], d.socket, os.getpid(), token, 0, 5) for _ in range(3)
        ]
        # 2. uid 65534 without the group: the socket's mode refuses it.
        no_group = _as_user(NOBODY, [], d.socket, os.getpid(), token, 0, 5)
        # 3. an allowed uid claiming the victim's pid and run token, and
        # sequence numbers that would collide with the victim's.
        intruder = _as_user(OTHER, [sock_gid], d.socket, os.getpid(), token, 500, 7)
        vs = victim["sock"]
        body = b"".join(wire.RECORD.pack(wire.REC_SPAN, 0, 0, 1, 10, 20, 0, 0) for _ in range(100))
        for i in range(5):
            vs.send(
                wire.HEADER.pack(wire.MAGIC, 1, wire.DGRAM_RECORDS, 100, 32, 500 + 100 * i, 1, 0, 0)
                + body
            )
        vs.send(wire.HEADER.pack(wire.MAGIC, 1, wire.DGRAM_BYE, 0, 32, 1000, 1, 0, 0))
        vs.recv(10)
        vs.close()
        assert d.stop()[0] == 0
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    assert all(r.get("recv") == 0 or "io_error" in r for r in refused), refused
    assert no_group.get("connect_error") == 13, no_group  # EACCES
    assert d.scalar("SELECT sum(count) FROM ingest_errors WHERE reason = 'uid_not_allowed'") == len(
        refused
    )
    runs = d.query(
        "SELECT pid, uid, claimed_pid, label, records, connections FROM runs ORDER BY run_id"
    )
    assert (os.getpid(), 0, os.getpid(), "victim", 1000, 1) == runs[0]
    # 500 + 7: the intruder's hello said first_seq 500 (a client_disconnected loss of
    # its own), its records are its own run's.
    assert runs[1] == (intruder["pid"], OTHER, os.getpid(), "intruder", 7, 1)
    assert len(runs) == 2  # nothing from uid 65534
    assert d.scalar("SELECT count(*) FROM runs WHERE uid = ?", [NOBODY]) == 0
    assert d.query("SELECT run_id, count FROM losses") == [(2, 500)]
    figures.update(
        refused_by_uid=len(refused),
        refused_by_mode=1,
        intruder_traced_as=intruder["pid"] != os.getpid(),
    )


def _walk(*roots):
    for root in roots:
        yield root
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                yield os.path.join(dirpath, name)


def test_socket_and_database_modes_nothing_world_writable(tmp_path, figures):
    state = tmp_path / "state"  # the daemon creates these directories
    run = tmp_path / "run"
    d = Daemon(tmp_path, db=str(state / "lib" / "stallscope.duckdb"))
    d.socket = str(run / "stallscope" / "probe.sock")
    d.start()
    try:
        probe = probe_client.connect(socket_path=d.socket, gc=False)
        for _ in range(200):
            probe.end("step", probe.begin())
        probe.close()
        sock_mode = stat.S_IMODE(os.stat(d.socket).st_mode)
        created_live = {p: stat.S_IMODE(os.lstat(p).st_mode) for p in _walk(state, run)}
        assert d.stop()[0] == 0
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    created = dict(created_live)
    created.update({p: stat.S_IMODE(os.lstat(p).st_mode) for p in _walk(state, run)})
    assert sock_mode == 0o660
    assert not os.path.exists(d.socket)  # removed at exit
    writable = {p: oct(m) for p, m in created.items() if m & stat.S_IWOTH}
    assert writable == {}
    db_dir = os.path.dirname(d.db)
    assert stat.S_IMODE(os.stat(db_dir).st_mode) & 0o007 == 0  # not world-readable
    # Traces are for the daemon and its group: 0640, WAL included (DuckDB
    # makes the WAL anew after each checkpoint, with the process umask).
    db_files = {
        p: m for p, m in created.items() if os.path.basename(p).startswith("stallscope.duckdb")
    }
    assert any(p.endswith(".wal") for p in db_files), db_files  # the WAL was seen live
    assert {p: oct(m) for p, m in db_files.items() if m != 0o640} == {}
    figures.update(
        socket_mode=oct(sock_mode),
        modes={os.path.relpath(p, tmp_path): oct(m) for p, m in created.items()},
    )
