"""STACKS requests on the probe socket: every thread's stacks, for the process's owner only.

`stallscope stacks PID` connects to the probe socket and sends a STACKS
datagram (probe_client/wire.py) instead of a HELLO. The kernel says who
asks (SO_PEERCRED, taken at accept): the request is answered only for a
uid of 0 or the process's real uid, and only for a process the daemon
traces; otherwise the answer is a refusal with a code (NOT_FOUND,
PERMISSION_DENIED, ...) and a message the command prints. Each uid gets
BURST requests, refilled at PER_S a second (RESOURCE_EXHAUSTED past it),
and at most MAX_PENDING captures run at once, each on its own short paced
thread, never on the ingest loop, which only checks and refuses. The
capture itself is the service's (`capture(pid)`, the hang watchdog's): it
returns frames and kernel state only, never locals or arguments. Answers
are sent in parts of at most STACKS_PART_MAX bytes; a requester that stops
reading gets the rest dropped after ANSWER_WAIT_S, never a blocked thread
of the daemon.
"""

import json
import logging
import select
import socket
import threading
import time
from collections import Counter

from probe_client import wire
from stallscope import threads
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

BURST = 5
PER_S = 1.0
MAX_PENDING = 2
ANSWER_WAIT_S = 5.0


def owner_uid(pid, proc_root="/proc"):
    """The real uid of process `pid` (None when it does not exist)."""
    try:
        with open(f"{proc_root}/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class StacksRequests:
    """Answers STACKS datagrams; `request(conn, data)` runs on the ingest loop."""

    def __init__(self, traced_pids, capture, proc_root="/proc"):
        self.traced_pids = traced_pids  # () -> set of pids the daemon traces now
        self.capture = capture  # pid -> the answer's dict (a worker thread)
        self.proc_root = proc_root
        self.counts = Counter()  # outcome ('answered' or a code) -> requests
        self._buckets = {}  # uid -> (tokens, monotonic s)
        self._lock = threading.Lock()
        self._pending = 0

    def _take_token(self, uid):
        now = time.monotonic()
        tokens, last = self._buckets.get(uid, (BURST, now))
        tokens = min(BURST, tokens + (now - last) * PER_S)
        if tokens < 1:
            self._buckets[uid] = (tokens, now)
            return False
        self._buckets[uid] = (tokens - 1, now)
        if len(self._buckets) > 4096:  # a bounded table: forget the full buckets
            self._buckets = {u: b for u, b in self._buckets.items() if b[0] < BURST}
        return True

    def request(self, conn, data):
        try:
            info = json.loads(data[wire.HEADER_SIZE :].decode("utf-8"))
            pid = int(info["pid"]) if isinstance(info, dict) else None
        except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
            pid = None
        if pid is None or not 0 < pid < 1 << 22:
            return self._refuse(conn, "INVALID_ARGUMENT", 'the request is not {"pid": N}')
        if self.capture is None:
            return self._refuse(
                conn, "UNAVAILABLE", "this daemon runs without the hang watchdog (hang.watchdog)"
            )
        if not self._take_token(conn.uid):
            return self._refuse(
                conn,
                "RESOURCE_EXHAUSTED",
                f"at most {BURST} stack requests at once and {PER_S:g} a second per user: "
                "try again in a second",
            )
        owner = owner_uid(pid, self.proc_root)
        if owner is None:
            return self._refuse(conn, "NOT_FOUND", f"no process {pid}")
        if conn.uid != 0 and owner != conn.uid:
            log.warning("refused the stacks of pid %d (uid %d) to uid %d", pid, owner, conn.uid)
            return self._refuse(
                conn,
                "PERMISSION_DENIED",
                f"pid {pid} belongs to uid {owner}: only its owner and root may see its stacks",
            )
        if pid not in self.traced_pids():
            return self._refuse(
                conn,
                "NOT_FOUND",
                f"pid {pid} is not traced by this daemon (no probe client connected, "
                "not followed with --pid or `stallscope run --no-client`)",
            )
        with self._lock:
            if self._pending >= MAX_PENDING:
                busy = True
            else:
                busy = False
                self._pending += 1
        if busy:
            return self._refuse(conn, "RESOURCE_EXHAUSTED", "busy: other captures run; try again")
        threading.Thread(
            target=self._answer, args=(conn, pid), name=f"stacks-{pid}", daemon=True
        ).start()
        return None

    def _answer(self, conn, pid):
        threads.paced("stacks")  # a hung engine may spin on every CPU but one
        try:
            answer = {"ok": True, **self.capture(pid)}
            self.counts["answered"] += 1
        except Exception as exc:
            log.exception("bug: the stacks of pid %d could not be read", pid)
            self.counts["INTERNAL"] += 1
            answer = {"ok": False, "code": "INTERNAL", "reason": f"{type(exc).__name__}: {exc}"}
        finally:
            with self._lock:
                self._pending -= 1
            threads.forget()
        send(conn.sock, json.dumps(answer).encode(), wait_s=ANSWER_WAIT_S)

    def _refuse(self, conn, code, reason):
        self.counts[code] += 1
        send(conn.sock, json.dumps({"ok": False, "code": code, "reason": reason}).encode())


def send(sock, payload, wait_s=0.0):
    """`payload` in parts (header record_count = parts still to come); a part
    that does not fit waits up to `wait_s` for room, then the rest is dropped.
    True when every part went."""
    size = wire.STACKS_PART_MAX
    parts = [payload[i : i + size] for i in range(0, len(payload), size)] or [b""]
    deadline = time.monotonic() + wait_s
    for n, part in enumerate(parts):
        header = wire.HEADER.pack(
            wire.MAGIC, wire.VERSION, wire.DGRAM_STACKS, len(parts) - 1 - n, 0, 0,
            time.monotonic_ns(), 0, 0,
        )  # fmt: skip
        while True:
            try:
                sock.send(header + part, socket.MSG_DONTWAIT)  # never blocks this thread
                break
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                try:
                    select.select([], [sock], [], min(left, 0.1))
                except (OSError, ValueError):
                    return False
            except OSError:
                return False  # the requester is gone: nothing to tell
    return True
