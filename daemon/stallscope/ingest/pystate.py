"""The CPU sampler's thread-state report: PYLAYOUT and PYTHREADS datagrams (wire v3).

A client says where its interpreter keeps Python frames (PYLAYOUT, JSON)
and which PyThreadState belongs to which of its threads (PYTHREADS, fixed
records). Both are untrusted input that ends up steering a kernel program's
reads, so here: the layout must be a JSON object whose version and build
agree with the connection's HELLO, and a thread is kept only when the
kernel says it belongs to the connection's process (SO_PEERCRED's pid:
`/proc/PID/task/TID` exists), with a user-space address for its state.
What passes goes to `on_pylayout(pid, run_id, info)` / `on_pythreads(pid,
run_id, threads)` (the service hands them to the CPU probe, which checks
the layout against its own object heads); what does not is counted in
`ingest_errors`: `bad_pylayout` (not an object, no status), `pylayout_mismatch`
(version or build differ from the HELLO), `pylayout_refused` (the probe
refused its offsets), `bad_pythreads` (bad record size or type, threads
before a layout), `foreign_tid` (a thread that is not the peer's). Never
raises into the reader loop; a refusal never disturbs other connections.
"""

import json
import os
import re

import numpy as np

from probe_client import wire

PYTHREAD_DTYPE = np.dtype(
    [
        ("rtype", "u1"),
        ("flags", "u1"),
        ("zero", "<u2"),
        ("tid", "<u4"),
        ("tstate", "<u8"),
        ("r1", "<u8"),
        ("r2", "<u8"),
    ]
)
assert PYTHREAD_DTYPE.itemsize == wire.RECORD_SIZE == wire.PYTHREAD_RECORD.size
# x86-64 user space ends below 2^47; a state below the first page is no pointer.
USER_ADDR_MIN = 4096
USER_ADDR_MAX = 1 << 47


class PyStateIngest:
    """The thread-state half of `Ingest` (a mixin: state lives on the Ingest)."""

    def _pylayout(self, conn, data):
        run = conn.run
        try:
            info = json.loads(data[wire.HEADER_SIZE :].decode("utf-8"))
            if not isinstance(info, dict) or not isinstance(info.get("status"), str):
                raise ValueError("not a layout report")
        except (ValueError, TypeError, OverflowError, RecursionError):
            return self._reject(run.run_id, conn.pid, "bad_pylayout")
        hello = conn.hello or {}
        version = info.get("version")
        claimed = str(hello.get("python") or "")
        m = re.match(r"(\d+)\.(\d+)\.(\d+)", claimed)  # "3.14.0rc2" is 3.14.0
        if not (
            isinstance(version, list)
            and m is not None
            and [str(v) for v in version[:3]] == list(m.groups())
            and bool(info.get("free_threaded")) == bool(hello.get("free_threaded"))
        ):
            conn.pylayout = False
            self._reject(run.run_id, conn.pid, "pylayout_mismatch")
            info = {
                **info,
                "status": f"refused: report (Python {version}, free-threaded "
                f"{bool(info.get('free_threaded'))}) disagrees with the HELLO "
                f"(Python {claimed or '?'}, free-threaded {bool(hello.get('free_threaded'))})",
            }
        if hello.get("free_threaded") and info["status"] == "ok":
            info = {**info, "status": "refused: free-threaded build: frame layout not supported"}
        hook = self.on_pylayout
        refused = hook(conn.pid, run.run_id, info) if hook is not None else "no CPU sampler"
        conn.pylayout = refused is None
        if refused is not None and info["status"] == "ok":
            # The client checked its layout and said ok; the daemon's own
            # checks (offsets inside the program's heads) disagreed.
            self._reject(run.run_id, conn.pid, "pylayout_refused")
        return None

    def _pythreads(self, conn, data, count, rsize):
        run = conn.run
        if (
            rsize != wire.RECORD_SIZE
            or len(data) != wire.HEADER_SIZE + count * wire.RECORD_SIZE
            or count > wire.MAX_RECORDS
        ):
            return self._reject(run.run_id, conn.pid, "bad_pythreads")
        if not conn.pylayout:
            # Threads without an accepted layout would steer nothing: counted
            # once per datagram, so a refused client's listings are visible.
            return self._reject(run.run_id, conn.pid, "bad_pythreads")
        recs = np.frombuffer(data, dtype=PYTHREAD_DTYPE, count=count, offset=wire.HEADER_SIZE)
        ok = (
            (recs["rtype"] == wire.REC_PYTHREAD)
            & (recs["tstate"] >= USER_ADDR_MIN)
            & (recs["tstate"] < USER_ADDR_MAX)
            & (recs["tid"] > 0)
        )
        bad = int((~ok).sum())
        if bad:
            self._reject(run.run_id, conn.pid, "bad_pythreads", bad)
        tids = recs["tid"][ok].tolist()
        states = recs["tstate"][ok].tolist()
        mine = self._tasks_of(conn.pid)
        threads = []
        foreign = 0
        for tid, state in zip(tids, states, strict=True):
            if tid in mine:
                threads.append((tid, state))
            else:
                foreign += 1
        if foreign:
            self._reject(run.run_id, conn.pid, "foreign_tid", foreign)
        more = bool(len(recs) and recs["flags"][0] & wire.PYTHREAD_MORE)
        if self.on_pythreads is not None:
            self.on_pythreads(conn.pid, run.run_id, threads, more)
        return None

    def _tasks_of(self, pid):
        """The kernel's thread ids of process `pid` now (/proc/PID/task)."""
        try:
            return {int(t) for t in os.listdir(f"{self.proc_root}/{pid}/task")}
        except (OSError, ValueError):
            return set()
