"""`stallscope run --no-client`: trace a command's GC from outside, nothing injected.

The command runs as it is (no PYTHONPATH, no sitecustomize) and, as with
the client, this process becomes it (`exec`): exit status, signals, stdio
and pid are the command's own. The daemon follows its GC passes through
CPython's USDT markers, which can only be attached once the process runs
the interpreter, i.e. after the exec. So before the exec a watcher process
(detached from us, so the command never has a child it did not make)
seizes this process with ptrace, stopping it at each exec; at the first
image that carries the markers it asks the daemon to follow the pid (the
WATCH datagram, wire.py), waits for the answer, and lets go: no pass of
the interpreter is missed. Images without markers (`env`, a shell that
then `exec`s python) are let through, up to MAX_EXECS. Where ptrace is
refused, the watcher falls back to asking right after the exec (passes in
the first milliseconds may be missed; it says so). An interpreter without
the markers (pyenv, python.org builds) is named in a warning. The daemon being
absent, or refusing, is a warning on stderr: the command always runs.
"""

import ctypes
import json
import os
import select
import signal
import socket
import sys
import time

from probe_client import wire

PTRACE_CONT = 7
PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_LISTEN = 0x4208
PTRACE_O_TRACEEXEC = 0x10
PTRACE_EVENT_EXEC = 4
PTRACE_EVENT_STOP = 128
PR_SET_PTRACER = 0x59616D61
WALL = 0x40000000  # __WALL
MAX_EXECS = 8
# The daemon compiles a BPF program for the process (seconds on a loaded
# machine): how long the held command waits for its answer at most.
ANSWER_TIMEOUT_S = 60.0
HANDSHAKE_TIMEOUT_S = 10.0
MARKER = b"gc__start"


def warn(text):
    print(f"stallscope: warning: {text}", file=sys.stderr, flush=True)


def has_markers(pid):
    """Whether the image `pid` runs carries CPython's gc USDT markers (their
    names sit in its .note.stapsdt section)."""
    try:
        with open(f"/proc/{pid}/exe", "rb") as f:
            tail = b""
            while chunk := f.read(1 << 20):
                if MARKER in tail + chunk:
                    return True
                tail = chunk[-len(MARKER) :]
    except OSError:
        return False
    return False


def _exe(pid):
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    return libc


def _ptrace(libc, request, pid, data=0):
    if libc.ptrace(request, pid, None, ctypes.c_void_p(data)) == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def ask_daemon(socket_path, pid, label):
    """(True, run_id) or (False, reason): the daemon's answer to WATCH `pid`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(ANSWER_TIMEOUT_S)
        sock.connect(socket_path)
        payload = json.dumps({"pid": pid, "label": label}).encode()
        header = wire.HEADER.pack(
            wire.MAGIC, wire.VERSION, wire.DGRAM_WATCH, 0, 0, 0, time.monotonic_ns(), 0, 0
        )
        sock.send(header + payload)
        data = sock.recv(wire.HEADER_SIZE + wire.HELLO_MAX)
    except OSError as exc:
        return False, f"no answer from the daemon at {socket_path}: {exc.strerror or exc}"
    finally:
        sock.close()
    if len(data) <= wire.HEADER_SIZE:
        return False, "the daemon does not know WATCH (older than this command)"
    try:
        answer = json.loads(data[wire.HEADER_SIZE :])
    except ValueError:
        return False, "the daemon's answer was not JSON"
    if answer.get("ok"):
        return True, answer.get("run_id")
    return False, str(answer.get("reason"))


def _watch(target, socket_path, label, name):
    ok, detail = ask_daemon(socket_path, target, label)
    if not ok:
        warn(f"{name} runs without GC tracing: {detail}")


def _follow_execs(libc, target, socket_path, label, name):
    """The seized command: wait for its execs, WATCH at the first marked image."""
    execs = 0
    while True:
        try:
            _, status = os.waitpid(target, WALL)
        except ChildProcessError:
            return
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            return  # ended before it ran a marked interpreter (or exec failed)
        if not os.WIFSTOPPED(status):
            continue
        sig, event = os.WSTOPSIG(status), status >> 16
        if event == PTRACE_EVENT_EXEC:
            execs += 1
            if has_markers(target):
                _watch(target, socket_path, label, name)
                _ptrace(libc, PTRACE_DETACH, target)
                return
            exe = _exe(target)
            if os.path.basename(exe).startswith("python"):
                warn(
                    f"{exe} has no USDT probe gc__start (CPython built without its dtrace "
                    "markers, e.g. pyenv or python.org builds; Debian's and Ubuntu's "
                    "/usr/bin/python3 have them): its GC is not traced"
                )
                _ptrace(libc, PTRACE_DETACH, target)
                return
            if execs >= MAX_EXECS:
                warn(f"{name}: no CPython with USDT markers after {execs} execs; GC untraced")
                _ptrace(libc, PTRACE_DETACH, target)
                return
            _ptrace(libc, PTRACE_CONT, target)
        elif event == PTRACE_EVENT_STOP:
            _ptrace(libc, PTRACE_LISTEN, target)  # a group stop: stay stopped, as asked
        else:
            _ptrace(libc, PTRACE_CONT, target, sig)  # a signal: deliver it


def _poll_for_exec(target, socket_path, label, name, why):
    """No ptrace: ask as soon as the image has markers (the first passes may be missed)."""
    warn(f"cannot hold {name} at its exec ({why}); GC passes of its first moments may be missed")
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
    while time.monotonic() < deadline and os.path.exists(f"/proc/{target}"):
        if has_markers(target):
            return _watch(target, socket_path, label, name)
        time.sleep(0.002)
    warn(f"{name}: no CPython with USDT markers found; GC untraced")


def _watcher(target, to_target, from_target, socket_path, label, name):
    """The watcher process's life (it never returns)."""
    status = 0
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)  # a pipe reading the command's stdout sees its end in time
        os.write(to_target, str(os.getpid()).encode())
        select.select([from_target], [], [], HANDSHAKE_TIMEOUT_S)
        libc = _libc()
        try:
            _ptrace(libc, PTRACE_SEIZE, target, PTRACE_O_TRACEEXEC)
        except OSError as exc:
            os.write(to_target, b"n")
            _poll_for_exec(target, socket_path, label, name, exc.strerror)
        else:
            os.write(to_target, b"y")
            _follow_execs(libc, target, socket_path, label, name)
    except BaseException as exc:  # never let the watcher's failure reach the command
        warn(f"{name}: GC tracing failed: {type(exc).__name__}: {exc}")
        status = 1
    os._exit(status)


def prepare(socket_path, label, name):
    """Start the watcher and wait until it holds this process; then the caller execs."""
    to_target_r, to_target_w = os.pipe()
    from_target_r, from_target_w = os.pipe()
    me = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        # Fork again and leave: the watcher is nobody's child in the command.
        try:
            if os.fork() == 0:
                os.close(to_target_r)
                os.close(from_target_w)
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # the command decides about ^C
                _watcher(me, to_target_w, from_target_r, socket_path, label, name)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    os.close(to_target_w)
    os.close(from_target_r)
    try:
        ready, _, _ = select.select([to_target_r], [], [], HANDSHAKE_TIMEOUT_S)
        watcher = int(os.read(to_target_r, 32) or 0) if ready else 0
        if watcher:
            try:  # Yama's ptrace_scope=1 lets only a named process trace us
                _libc().prctl(PR_SET_PTRACER, ctypes.c_ulong(watcher), 0, 0, 0)
            except (OSError, AttributeError):
                pass
            os.write(from_target_w, b"g")
            select.select([to_target_r], [], [], HANDSHAKE_TIMEOUT_S)
            os.read(to_target_r, 1)
        else:
            warn(f"{name}: the GC watcher did not start; GC untraced")
    finally:
        os.close(to_target_r)
        os.close(from_target_w)
