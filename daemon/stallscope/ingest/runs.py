"""Run bookkeeping for probe ingest: HELLO handling, resuming runs, the `runs` row, run events.

A HELLO starts a run or resumes one (same client token and same kernel pid,
from memory or, after a daemon restart, from the database) and records the
process as the kernel sees it (SO_PEERCRED) next to what it claims. It also
places the run in its run group (`runs.parent_run_id`, `runs.group_key`):
the parent is the traced run of an ancestor on the kernel's ppid chain
(`/proc/PID/stat`), the one `stallscope run` named when the chain holds it;
a group key the client gives joins only runs of the same uid. Client
values are bounded before they reach a column: a lie costs a NULL, never a
failed write. Never trusts a client-supplied pid for tracing. An EVENT
datagram (a client's word about its own set-up, e.g. an attach spec it
could not use) becomes a `run_events` row, at most 1,000 per run.
"""

import json
import logging
import time
from collections import Counter

import pyarrow as pa

from probe_client import wire
from stallscope.ingest.records import RunState
from stallscope.vocab.log_channels import log_channel
from stallscope.vocab.schema import STORED_NS_SQL

log = logging.getLogger(log_channel(__name__))

# A client reports its set-up in a few events (one per attach spec); more
# than this from one run is refused (`too_many_events`), so none can flood.
MAX_EVENTS_PER_RUN = 1000


RUN_COLUMNS = (
    "run_id pid uid gid claimed_pid tid label host started_ns realtime_ns python "
    "implementation free_threaded gc_threshold gc_count freeze_count gc_enabled argv "
    "client_token connected_ns last_seq probe_accel gc_freeze_after_s gc_threshold_set census "
    "parent_run_id group_key rank"
).split()

# How far up the kernel's ppid chain a parent run is looked for (a launcher
# between the engine and its workers, multiprocessing's forkserver).
MAX_ANCESTORS = 8
# A client's group key: short printable text (it is stored and shown).
GROUP_KEY_MAX = 120


class RunRegistry:
    """The HELLO half of `Ingest` (a mixin: state lives on the Ingest)."""

    def _take_run_writes(self):
        """(runs started, {run_id: [connections added, ended_ns]}) since the
        last call; written by `_write_runs` at the end of the same decode."""
        with self._lock:
            new, self._new_runs = self._new_runs, []
            changes, self._run_changes = self._run_changes, {}
        return new, changes

    def _write_runs(self, new, changes):
        """New runs as one Arrow batch carrying their current counters (a
        statement per HELLO cost the writer ~1 ms, and a flood of short
        sessions must cost no more than the datagrams it sends); changes to
        older runs as one UPDATE (the store writes rows before statements,
        so the UPDATE finds a run appended by an earlier decode even when
        both land in one flush). Returns the ids of the new runs."""
        new_ids = set()
        if new:
            cols = {name: [] for name in RUN_COLUMNS}
            cols.update(records=[], connections=[], ended_ns=[])
            for run, values in new:
                for name, value in zip(RUN_COLUMNS, values, strict=True):
                    cols[name].append(value)
                cols["last_seq"][-1] = run.expected_seq - 1
                cols["records"].append(run.records)
                conns, ended = changes.pop(run.run_id, (0, None))
                cols["connections"].append(1 + conns)
                cols["ended_ns"].append(ended)
                new_ids.add(run.run_id)
            for name, value in self.run_defaults.items():
                if value is not None:  # absent: NULL
                    cols[name] = [value] * len(new)
            # client_token is UBIGINT: a token of 2^63 or more (a client's
            # -1 masked to 64 bits) does not fit the int64 pyarrow would infer.
            cols["client_token"] = pa.array(cols["client_token"], type=pa.uint64())
            self.store.append("runs", cols)
        if changes:
            ids = list(changes)
            self.store.sql(
                "UPDATE runs SET connections = runs.connections + u.conns, ended_ns = u.ended, "
                f"stored_ns = {STORED_NS_SQL} FROM (SELECT unnest(?::BIGINT[]) AS run_id, unnest(?::BIGINT[]) AS conns, "
                "unnest(?::BIGINT[]) AS ended) u WHERE runs.run_id = u.run_id",
                [ids, [changes[r][0] for r in ids], [changes[r][1] for r in ids]],
            )
        return new_ids

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
                change = self._run_changes.setdefault(run.run_id, [0, None])
                change[0] += 1
                change[1] = None  # connected again: not ended
            run.connected = True
            run.last_sent_ns = sent_ns
            run.hang_threshold_ns = _hang_threshold_ns(info.get("hang_threshold_ms"))
            conn.run = run
            conn.hello = {"python": info.get("python"), "free_threaded": info.get("free_threaded")}
            self.runs[run.run_id] = run
            if token:
                self.runs_by_token[(token, conn.pid)] = run
        # The probes follow the process before the line says it connected:
        # whoever waits for that line (a user, a test, a script that starts
        # its work then) gets a process whose switches are already seen.
        # Logged first, the kernel probes missed a new thread's first
        # switches 1 run in 4 (tests/probes/test_sched_summary.py).
        self.on_track(conn.pid, run.run_id)
        self._log_conn(
            "run %d: pid %d uid %d connected (%s)",
            run.run_id,
            conn.pid,
            conn.uid,
            info.get("label") or "no label",
        )
        return None

    def external_run(self, pid, argv, label):
        """A run for a process with no probe client (its GC from USDT): a
        `runs` row with the kernel pid and its command line; returns run_id."""
        now = time.monotonic_ns()
        with self._lock:
            run_id = self._next_run_id
            self._next_run_id += 1
            self.store.sql(
                "INSERT INTO runs (run_id, pid, label, host, started_ns, argv, connected_ns, "
                "records, connections) VALUES (?, ?, ?, ?, ?, ?, ?, 0, 0)",
                [
                    run_id,
                    pid,
                    str(label)[:200],
                    self.host,
                    now,
                    [str(a)[:500] for a in argv[:64]],
                    now,
                ],
            )
        return run_id

    def external_run_ended(self, run_id, ended_ns):
        """The process of an `external_run` exited: `ended_ns`, written with
        the next decode (any thread)."""
        with self._lock:
            change = self._run_changes.setdefault(run_id, [0, None])
            change[1] = ended_ns

    def _event(self, run, data, pid):
        """An EVENT datagram: one `run_events` row (a bad one is `bad_event`)."""
        try:
            info = json.loads(data[wire.HEADER_SIZE :].decode("utf-8"))
            if not isinstance(info, dict):
                raise ValueError("not an object")
        except (ValueError, TypeError, OverflowError, RecursionError):
            return self._reject(run.run_id, pid, "bad_event")
        counts = self.__dict__.setdefault("_events_per_run", Counter())
        counts[run.run_id] += 1
        if counts[run.run_id] > MAX_EVENTS_PER_RUN:
            return self._reject(run.run_id, pid, "too_many_events")
        self.store.sql(
            "INSERT INTO run_events (run_id, ts_ns, kind, target, message) VALUES (?, ?, ?, ?, ?)",
            [
                run.run_id,
                _int(info.get("ts_ns")),
                str(info.get("kind") or "")[:40],
                str(info.get("target") or "")[:2000],
                str(info.get("message") or "")[:2000],
            ],
        )
        if info.get("kind") != "attached" and counts[run.run_id] <= 10:
            log.warning("run %d: %s", run.run_id, str(info.get("message") or "")[:300])
        return None

    def _known_run(self, token, pid):
        """A run this database already holds (the daemon was restarted)."""
        if not token or pid not in self._db_pids:
            # Only a pid with runs in the database can resume one from there;
            # a query per HELLO would cost ~1 ms of the reader's time.
            return None
        try:
            cur = self.store.cursor(fresh=False)  # under self._lock; the row is old
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

    def _ancestors(self, pid):
        """The kernel's ppid chain of `pid` (nearest first, at most MAX_ANCESTORS)."""
        chain = []
        for _ in range(MAX_ANCESTORS):
            try:
                with open(f"{self.proc_root}/{pid}/stat", "rb") as f:
                    stat = f.read()
                # comm may hold spaces and parentheses: fields follow the last ')'
                pid = int(stat[stat.rindex(b")") + 2 :].split()[1])
            except (OSError, ValueError, IndexError):
                break
            if pid <= 1:
                break
            chain.append(pid)
        return chain

    def _lineage(self, run, conn, info):
        """(parent_run_id, group_key, rank) of a new run; sets run.group_key.

        Called under self._lock. The parent comes from the kernel; the
        client's word (`parent_pid`, from `stallscope run`'s hand-down) only
        picks which ancestor, when it is on the kernel's chain."""
        live = {}  # pid -> latest run of that pid this daemon knows
        for other in self.runs.values():
            if other.pid is not None and other.run_id != run.run_id:
                if other.pid not in live or other.run_id > live[other.pid].run_id:
                    live[other.pid] = other
        chain = self._ancestors(conn.pid) if live else []
        claimed = _int(info.get("parent_pid"), 32)
        parent = None
        if claimed in chain and claimed in live:
            parent = live[claimed]
        else:
            parent = next((live[p] for p in chain if p in live), None)
        key = info.get("group")
        if isinstance(key, str) and key.strip() and key.isprintable():
            group = f"u{conn.uid}:{key.strip()[:GROUP_KEY_MAX]}"
        elif parent is not None and parent.group_key:
            group = parent.group_key
        else:
            group = f"run:{run.run_id}"
        run.uid = conn.uid
        run.group_key = group
        rank = _int(info.get("rank"), 32)
        return (parent.run_id if parent is not None else None), group, rank

    def _insert_run(self, run, conn, info, now):
        def ints(v):
            return [_int(x, 32) for x in v[:16]] if isinstance(v, list) else None

        argv = info.get("argv")
        # Written by decode_pending(), with every run started since the last
        # decode, in one batch (see _write_runs).
        self._new_runs.append(
            (
                run,
                (
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
                    _accel_name(info.get("accelerator")),
                    *_knobs(info),
                    *self._lineage(run, conn, info),
                ),
            )
        )


def _accel_name(v):
    """The client's record write ('c', 'python'), else None (unknown or absent)."""
    return v if v in ("c", "python") else None


def _int(v, bits=64):
    """A client-supplied number as an int that fits a signed `bits` column, else None."""
    try:
        n = int(v) if v is not None else None
    except (TypeError, ValueError, OverflowError):
        return None
    if n is not None and not -(1 << (bits - 1)) <= n < (1 << (bits - 1)):
        return None
    return n


def _knobs(info):
    """(gc_freeze_after_s, gc_threshold_set, census) from a HELLO; NULL when absent or bad."""
    knobs = info.get("gc_knobs")
    knobs = knobs if isinstance(knobs, dict) else {}
    freeze = knobs.get("freeze_after_s")
    try:
        freeze = float(freeze) if freeze is not None else None
        if freeze is not None and not 0 <= freeze < 1e9:
            freeze = None
    except (TypeError, ValueError, OverflowError):
        freeze = None
    threshold = knobs.get("threshold")
    if isinstance(threshold, list) and 1 <= len(threshold) <= 3:
        threshold = [_int(x, 32) for x in threshold]
    else:
        threshold = None
    census = info.get("census")
    return freeze, threshold, census if isinstance(census, bool) else None


# A client's own hang threshold (docs/hang.md) is kept within these bounds:
# below 100 ms a busy engine's ordinary pauses would be hangs; above a day it
# means "never".
HANG_THRESHOLD_MIN_NS = 100_000_000
HANG_THRESHOLD_MAX_NS = 86_400_000_000_000


def _hang_threshold_ns(value):
    """The HELLO's hang_threshold_ms as ns within bounds; 0 when absent or bad."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return 0
    ns = value * 1e6
    if ns != ns or ns == float("inf"):
        return 0
    return int(min(max(ns, HANG_THRESHOLD_MIN_NS), HANG_THRESHOLD_MAX_NS))
