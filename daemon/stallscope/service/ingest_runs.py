"""Run bookkeeping for probe ingest: HELLO handling, resuming runs, the `runs` row.

A HELLO starts a run or resumes one (same client token and same kernel pid,
from memory or, after a daemon restart, from the database) and records the
process as the kernel sees it (SO_PEERCRED) next to what it claims. Client
values are bounded before they reach a column: a lie costs a NULL, never a
failed write. Never trusts a client-supplied pid for tracing.
"""

import json
import logging
import time

from probe_client import wire
from stallscope.service.ingest_records import RunState

log = logging.getLogger("stallscope.ingest")


class RunRegistry:
    """The HELLO half of `Ingest` (a mixin: state lives on the Ingest)."""

    def _hello(self, conn, data, first_seq, sent_ns):
        try:
            info = json.loads(data[wire.HEADER_SIZE :].decode("utf-8"))
            if not isinstance(info, dict):
                raise ValueError("not an object")
            token = int(info.get("run_token", 0)) & 0xFFFFFFFFFFFFFFFF
        except (ValueError, TypeError, OverflowError, RecursionError):
            # UnicodeDecodeError is a ValueError; Infinity is an OverflowError;
            # "[[[[..." nested 5000 deep is a RecursionError.
            return self._reject(None, conn.pid, "bad_hello")
        now = time.monotonic_ns()
        with self._lock:
            # A token is only honoured for the same kernel pid, and token 0
            # (none given) never resumes anything: two runs never share state.
            run = self.runs_by_token.get((token, conn.pid)) if token else None
            if run is None:
                run = self._known_run(token, conn.pid)
            if run is None:
                run = RunState(self._next_run_id, token, conn.pid, first_seq)
                self._next_run_id += 1
                self._insert_run(run, conn, info, now)
                if first_seq > 0:  # records the client made before it could connect
                    self._loss(
                        run,
                        first_seq,
                        _int(info.get("monotonic_ns")) or sent_ns,
                        sent_ns,
                        "client_disconnected",
                    )
            else:
                if first_seq > run.expected_seq:
                    # connected is None: the run comes from the database, so
                    # the gap is what the previous daemon had not committed
                    # plus what the client dropped while no daemon was there.
                    reason = (
                        "client_disconnected"
                        if run.connected is False
                        else "daemon_restart"
                        if run.connected is None
                        else "sequence_gap"
                    )
                    self._loss(run, first_seq - run.expected_seq, run.last_sent_ns, sent_ns, reason)
                    run.expected_seq = first_seq
                run.names = [None]  # the client re-sends every name on a new connection
                self.store.sql(
                    "UPDATE runs SET connections = connections + 1, ended_ns = NULL "
                    "WHERE run_id = ?",
                    [run.run_id],
                )
            run.connected = True
            run.last_sent_ns = sent_ns
            conn.run = run
            self.runs[run.run_id] = run
            if token:
                self.runs_by_token[(token, conn.pid)] = run
        log.info(
            "run %d: pid %d uid %d connected (%s)",
            run.run_id,
            conn.pid,
            conn.uid,
            info.get("label") or "no label",
        )
        self.on_track(conn.pid, run.run_id)
        return None

    def _known_run(self, token, pid):
        """A run this database already holds (the daemon was restarted)."""
        if not token:
            return None
        try:
            cur = self.store.cursor()
            try:
                row = cur.execute(
                    "SELECT run_id, last_seq FROM runs WHERE client_token = ? "
                    "AND pid = ? ORDER BY run_id DESC LIMIT 1",
                    [token, pid],
                ).fetchone()
            finally:
                cur.close()
        except Exception as exc:  # the store may be reopening after a disk error
            log.warning("could not look up run token for pid %d: %s", pid, exc)
            return None
        if row is None:
            return None
        run = RunState(row[0], token, pid, (row[1] if row[1] is not None else -1) + 1)
        run.connected = None  # unknown: the gap's reason is the restart
        return run

    def _insert_run(self, run, conn, info, now):
        def ints(v):
            return [_int(x, 32) for x in v[:16]] if isinstance(v, list) else None

        argv = info.get("argv")
        self.store.sql(
            "INSERT INTO runs (run_id, pid, uid, gid, claimed_pid, tid, label, host, "
            "started_ns, realtime_ns, python, implementation, free_threaded, gc_threshold, "
            "gc_count, freeze_count, gc_enabled, argv, client_token, connected_ns, last_seq, "
            "records, connections) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
            "?, ?, ?, ?, 0, 1)",
            [
                run.run_id,
                conn.pid,
                conn.uid,
                conn.gid,
                _int(info.get("pid"), 32),
                _int(info.get("tid")),
                str(info.get("label") or "")[:200],
                self.host,
                _int(info.get("monotonic_ns")),
                _int(info.get("realtime_ns")),
                str(info.get("python") or "")[:40],
                str(info.get("implementation") or "")[:40],
                bool(info.get("free_threaded")),
                ints(info.get("gc_threshold")),
                ints(info.get("gc_count")),
                _int(info.get("freeze_count")),
                info.get("gc_enabled") if isinstance(info.get("gc_enabled"), bool) else None,
                [str(a)[:500] for a in argv[:64]] if isinstance(argv, list) else None,
                run.token,
                now,
                run.expected_seq - 1,
            ],
        )


def _int(v, bits=64):
    """A client-supplied number as an int that fits a signed `bits` column, else None."""
    try:
        n = int(v) if v is not None else None
    except (TypeError, ValueError, OverflowError):
        return None
    if n is not None and not -(1 << (bits - 1)) <= n < (1 << (bits - 1)):
        return None
    return n
