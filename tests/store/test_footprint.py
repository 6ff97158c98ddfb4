"""The daemon's own footprint: it sleeps when idle, its memory stays bounded
under a flood, it reports its CPU and RSS and warns when it shares CPUs with
a traced engine, and a preemption by the daemon names the daemon.

Real daemon processes, real sockets and database files; the eBPF test needs
root and bcc. Nothing here times anything: idleness is counted in wake-ups
(context switches), memory in rows queued and bytes resident.
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from helpers.daemonproc import DaemonProcess
from helpers.privileged import require_privileged
from helpers.waiting import wait_for
from probe_client import wire
from stallscope.probes import bpf_common
from stallscope.service import server
from stallscope.store import database as store
from stallscope.store.database import DEFAULT_MAX_BACKLOG_ROWS
from stallscope.testing.flood import FLOOD_SCRIPT

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

# Records the daemon's bounds as they are exercised: the largest queue a flush
# took and the most records read before a decode. Written at exit.
BOUNDS_PREAMBLE = textwrap.dedent(
    """
    import atexit, json, os
    from stallscope.ingest import records as ingest_records
    from stallscope.store import database as store
    seen = {"flush_rows": 0, "undecoded": 0}
    _flush, _decode = store.Store.flush, ingest_records.RecordDecoder.decode_pending
    def flush(self, *args, **kwargs):
        seen["flush_rows"] = max(seen["flush_rows"], self.pending_rows)
        return _flush(self, *args, **kwargs)
    def decode_pending(self):
        seen["undecoded"] = max(seen["undecoded"], self.undecoded)
        return _decode(self)
    store.Store.flush, ingest_records.RecordDecoder.decode_pending = flush, decode_pending
    atexit.register(lambda: open(os.environ["BOUNDS_OUT"], "w").write(json.dumps(seen)))
    """
)


def flood(sock, seconds, senders=4, cpu=None):
    pre = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
    return [
        subprocess.Popen(
            [sys.executable, FLOOD_SCRIPT, sock, str(seconds), str(i + 1)],
            stdout=subprocess.PIPE,
            preexec_fn=pre,
        )
        for i in range(senders)
    ]


def status_kb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def wakeups(pid):
    """Voluntary context switches of every thread of `pid` so far."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            total += status_kb(f"{pid}/task/{tid}", "voluntary_ctxt_switches")
        except OSError:
            pass
    return total


# ----- cost follows work ------------------------------------------------------------


def test_cadence_stretches_while_quiet_and_snaps_back_when_busy():
    c = bpf_common.Cadence(0.02, busy_max_s=0.2, idle_max_s=0.5, batch_records=1000)
    waits = [c.next(0) for _ in range(8)]
    assert waits[0] == 0.04 and waits[-1] == 0.5  # doubles up to idle_max_s
    assert c.next(5000) == 0.02  # a full batch: read at full rate again
    assert [c.next(10) for _ in range(6)][-1] == 0.2  # a trickle: up to busy_max_s
    assert c.next(0) == 0.4 and c.next(0) == 0.5
    assert c.next(1000) == 0.02
    bpf_common.LIVE.set()  # someone watches the live stream: full rate
    try:
        assert c.next(0) == 0.02
    finally:
        bpf_common.LIVE.clear()


def test_idle_daemon_wakes_a_few_times_a_second(tmp_path):
    """No client, no probes: the main loop and the writer sleep (they used to
    wake 20 and 5 times a second)."""
    d = DaemonProcess(tmp_path).start()
    try:
        time.sleep(1.0)  # start-up done
        w0, t0 = wakeups(d.proc.pid), time.monotonic()
        time.sleep(3.0)
        per_s = (wakeups(d.proc.pid) - w0) / (time.monotonic() - t0)
    finally:
        rc, _ = d.stop()
    assert rc == 0, d.read_log()
    assert per_s < 8, f"{per_s:.1f} wake-ups/s while idle"


def test_rows_are_written_when_read_and_progress_once_per_flush(tmp_path):
    """A reader through the daemon sees what was appended before it asked,
    although the writer flushes only once a second."""
    s = store.Store(str(tmp_path / "f.duckdb"), flush_interval_s=3600)
    calls = []
    s.add_flush_hook(lambda: calls.append(1) or [])
    s.start()
    try:
        s.append("steal", {"cpu": [0], "start_ns": [1], "end_ns": [2], "steal_ns": [1]})
        cur = s.cursor()
        assert cur.execute("SELECT count(*) FROM steal").fetchone()[0] == 1
        cur.close()
        assert calls  # the hook ran with that flush
        assert s.pending_rows == 0
    finally:
        s.close()


def steal(n):
    """n rows of the steal table (a probe table)."""
    return {"cpu": [0] * n, "start_ns": [1] * n, "end_ns": [2] * n, "steal_ns": [1] * n}


def written(s, table):
    """Rows of `table` in the database, without flushing what is queued."""
    cur = s.cursor(fresh=False)
    try:
        return cur.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        cur.close()


def test_a_probe_table_with_few_rows_waits_longer_and_a_reader_still_sees_it(tmp_path, monkeypatch):
    """The probes' tables are written every probe_flush_interval_s, but one
    with fewer than SMALL_PROBE_ROWS queued waits up to SMALL_PROBE_WAIT_S
    (each INSERT's cost is fixed); the CPU sampler's tables go together; a
    reader's cursor() writes everything first."""
    monkeypatch.setattr(store, "SMALL_PROBE_WAIT_S", 2.5)
    s = store.Store(str(tmp_path / "p.duckdb"), flush_interval_s=0.05, probe_flush_interval_s=0.3)

    big = store.SMALL_PROBE_ROWS
    s.start()
    try:
        t0 = time.monotonic()
        s.append("steal", steal(1))
        s.append("runq", {"pid": [1] * big, "tid": [1] * big, "start_ns": [1] * big})
        s.append("cpu_samples", {"pid": [1] * big, "tid": [1] * big, "ts_ns": [1] * big})
        s.append("cpu_frames", {"frame_id": [1], "function": ["f"]})
        assert wait_for(lambda: written(s, "runq") == big, timeout_s=20)
        assert written(s, "cpu_samples") == big  # due with runq: the same flush
        assert written(s, "cpu_frames") == 1  # the CPU sampler's tables are one group
        if time.monotonic() - t0 < 2.0:  # (a stalled machine may have passed the long wait)
            assert written(s, "steal") == 0
        assert wait_for(lambda: written(s, "steal") == 1, timeout_s=20)
        assert time.monotonic() - t0 >= 2.5
        s.append("steal", steal(1))
        assert s.cursor().execute("SELECT count(*) FROM steal").fetchone()[0] == 2
    finally:
        s.close()


def test_a_decode_is_written_at_once_and_the_probe_tables_keep_their_wait(tmp_path):
    """The main loop's decoded() has the writer flush the clients' rows at
    once (one flush per decode); without it they wait for flush_interval_s,
    here an hour. The probes' tables keep their own, longer wait."""
    s = store.Store(str(tmp_path / "d.duckdb"), flush_interval_s=3600)
    n = 7
    s.start()
    try:
        s.decoded()  # nothing queued: no flush
        s.append("spans", {"run_id": [1] * n, "seq": list(range(n)), "start_ns": [1] * n})
        s.append("steal", {"cpu": [0], "start_ns": [1], "end_ns": [2], "steal_ns": [1]})
        time.sleep(0.5)
        assert s.rows_written == 0 and s.flushes == 0  # the hour's age rule holds them
        s.decoded()
        assert wait_for(lambda: s.rows_written == n, timeout_s=20)
        assert s.flushes == 1 and s.pending_rows == 1  # the steal row waits on
        s.decoded()  # nothing of the clients' queued: no flush
        time.sleep(0.3)
        assert s.flushes == 1
    finally:
        s.close()


def test_a_probes_loss_rides_with_the_next_flush_or_the_small_tables_wait(tmp_path, monkeypatch):
    """A probe's loss row starts no flush of its own (the client tables'
    0.5 s age rule): it is written with the next flush of any kind, or at
    the latest when a small probe table would be."""
    monkeypatch.setattr(store, "SMALL_PROBE_WAIT_S", 2.0)
    s = store.Store(str(tmp_path / "r.duckdb"), flush_interval_s=0.05, probe_flush_interval_s=0.1)

    def loss(i):
        s.record_losses("cpu", [(None, i, i + 1, 1, "native leaf only")], ride=True)

    s.start()
    try:
        t0 = time.monotonic()
        loss(1)
        time.sleep(0.5)  # ten times the clients' age rule
        if time.monotonic() - t0 < 1.5:
            assert s.flushes == 0
        s.append("spans", {"run_id": [1], "seq": [0], "start_ns": [1]})
        assert wait_for(lambda: s.rows_written == 2, timeout_s=20)  # with the span, one flush
        assert s.flushes == 1
        loss(2)
        assert wait_for(lambda: s.rows_written == 3, timeout_s=20)  # alone: the small tables' wait
        assert time.monotonic() - t0 >= 2.0
        assert s.flushes == 2
    finally:
        s.close()


def test_a_decodes_flush_takes_the_probe_tables_due_before_the_next(tmp_path):
    """The probe tables due before the next decode's flush (expected as far
    off as the last two decodes were apart) go with this one: one
    transaction; those due later keep their own."""
    s = store.Store(str(tmp_path / "t.duckdb"), flush_interval_s=1.0, probe_flush_interval_s=1.0)

    big = store.SMALL_PROBE_ROWS
    s.start()
    try:
        s.decoded()
        time.sleep(0.6)
        s.decoded()  # decodes 0.6 s apart
        s.append("steal", steal(big))  # due in 1 s
        time.sleep(0.6)  # now due in 0.4 s: before the next decode
        s.append("runq", {"pid": [1] * big, "tid": [1] * big, "start_ns": [1] * big})  # in 1 s
        s.append("spans", {"run_id": [1], "seq": [0], "start_ns": [1]})
        s.decoded()
        assert wait_for(lambda: s.flushes >= 1, timeout_s=20)
        if s.flushes == 1:  # (a stalled writer may have seen steal come due on its own)
            assert written(s, "steal") == big and written(s, "spans") == 1
        assert written(s, "runq") == 0 or s.flushes >= 2
        assert wait_for(lambda: written(s, "runq") == big, timeout_s=20)  # its own, later
    finally:
        s.close()


def test_writer_flushes_early_when_rows_pile_up(tmp_path):
    s = store.Store(str(tmp_path / "g.duckdb"), flush_interval_s=3600, flush_rows=100)
    s.start()
    try:
        n = 150
        s.append(
            "steal", {"cpu": [0] * n, "start_ns": [1] * n, "end_ns": [2] * n, "steal_ns": [1] * n}
        )
        assert wait_for(lambda: s.rows_written >= n, timeout_s=30)
    finally:
        s.close()


def test_batches_typed_differently_by_two_producers_share_a_flush(tmp_path):
    """With a flush a second, batches of one table from two producers meet in
    one flush (the USDT GC probe types `generation` int64, ingest int8; comm
    columns come dictionary-encoded or plain): all of them are written."""
    import numpy as np
    import pyarrow as pa

    s = store.Store(str(tmp_path / "m.duckdb"), flush_interval_s=3600)
    s.append(
        "gc_events",
        {"run_id": [1], "generation": np.array([2], np.int8), "start_ns": [1], "end_ns": [2]},
    )
    s.append(
        "gc_events",
        {"run_id": [1], "generation": np.array([1], np.int64), "start_ns": [3], "end_ns": [4]},
    )
    s.append("probe_status", {"ts_ns": [1], "probe": pa.array(["a"]).dictionary_encode()})
    s.append("probe_status", {"ts_ns": [2], "probe": ["b"]})
    try:
        assert s.flush() == 4
        cur = s.cursor()
        assert cur.execute("SELECT generation FROM gc_events ORDER BY 1").fetchall() == [(1,), (2,)]
        assert cur.execute("SELECT count(*) FROM probe_status").fetchone()[0] >= 2
        cur.close()
    finally:
        s.close()


# ----- bounded memory ---------------------------------------------------------------------


def test_flood_keeps_queues_and_memory_bounded(tmp_path):
    """Four senders as fast as the socket takes them: every record is stored,
    no flush takes more than the pending bound plus one decode, no decode
    waits for more than one batch plus one selector round, and the daemon's
    resident memory grows by far less than the ~450 MB it used to."""
    out = tmp_path / "bounds.json"
    os.environ["BOUNDS_OUT"] = str(out)
    try:
        d = DaemonProcess(tmp_path, preamble=BOUNDS_PREAMBLE).start()
    finally:
        del os.environ["BOUNDS_OUT"]
    try:
        rss0 = status_kb(d.proc.pid, "VmRSS")
        senders = flood(d.socket, 4.0)
        peak = rss0
        while any(p.poll() is None for p in senders):
            peak = max(peak, status_kb(d.proc.pid, "VmRSS"))
            time.sleep(0.1)
        sent = sum(int(p.communicate()[0].split()[-1]) for p in senders)
    finally:
        rc, _ = d.stop(timeout_s=120)
    assert rc == 0, d.read_log()
    stored = d.scalar("SELECT count(*) FROM spans")
    assert stored == sent > 0
    seen = json.loads(out.read_text())
    one_round = 4 * 256 * wire.MAX_RECORDS  # DATAGRAMS_PER_ROUND per sender
    assert seen["undecoded"] <= server.DECODE_BATCH_RECORDS + one_round, seen
    pause_rows = server.INGEST_PAUSE_SHARE * DEFAULT_MAX_BACKLOG_ROWS
    assert seen["flush_rows"] <= pause_rows + 2 * one_round, seen
    grew_mb = (peak - rss0) / 1024
    assert grew_mb < 300, f"RSS grew {grew_mb:.0f} MB under the flood"


# ----- status and placement ----------------------------------------------------------------


def _client(sock, cpu=None):
    code = (
        "import sys, time, probe_client\n"
        "p = probe_client.connect(socket_path=sys.argv[1], run_label='placed')\n"
        "t = p.begin(); p.end('step', t)\n"
        "sys.stdin.read()\n"
    )
    pre = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
    return subprocess.Popen(
        [sys.executable, "-c", code, sock], stdin=subprocess.PIPE, preexec_fn=pre
    )


def _status(d, path):
    return subprocess.run(
        [sys.executable, "-m", "stallscope.cli", "status", "--db", d.db]
        + ["--api-socket", str(path / "api.sock")],
        capture_output=True,
        text=True,
    ).stdout


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "apart"])
def test_status_shows_footprint_and_warns_only_when_cpus_are_shared(tmp_path, shared):
    cpus = sorted(os.sched_getaffinity(0))
    d = DaemonProcess(tmp_path, extra_args=["--api-socket", str(tmp_path / "api.sock")]).start()
    if not shared:
        for tid in os.listdir(f"/proc/{d.proc.pid}/task"):
            os.sched_setaffinity(int(tid), {cpus[0]})
    client = _client(d.socket, cpu=None if shared else cpus[1])
    try:
        # The run is connected and tracked; the next status read flushes the
        # sample the tracking change wrote.
        assert wait_for(lambda: "placed" in _status(d, tmp_path), timeout_s=30)
        if shared:
            assert wait_for(lambda: "can preempt" in d.new_log(), timeout_s=30), d.new_log()
        assert wait_for(lambda: len(_stats_live(d, tmp_path)) >= 2, timeout_s=30)
        status = _status(d, tmp_path)
        assert "Daemon footprint" in status and str(d.proc.pid) in status, status
    finally:
        client.communicate(b"")
        rc, _ = d.stop()
    assert rc == 0, d.read_log()
    rows = d.query("SELECT pid, cpu_pct, rss_bytes, shared_pids, warning FROM daemon_stats")
    assert all(r[0] == d.proc.pid and r[1] >= 0 and r[2] > 0 for r in rows), rows
    with_client = [r for r in rows if client.pid in (r[3] or [])]
    if shared:
        assert with_client and "CPUAffinity=" in with_client[0][4]
        assert f"pid(s) {client.pid}" in with_client[0][4]
    else:
        assert not with_client and all(r[4] is None for r in rows), rows


def _stats_live(d, path):
    """daemon_stats rows, read through the running daemon's API."""
    from stallscope.api.client import ApiSource

    src = ApiSource(str(path / "api.sock"))
    try:
        return src.query("SELECT ts_ns FROM daemon_stats")[1]
    finally:
        src.close()


# ----- the tracer as a preemptor --------------------------------------------------------------

ENGINE = textwrap.dedent(
    """
    import sys, time, probe_client
    p = probe_client.connect(socket_path=sys.argv[1], run_label="spinner")
    # The daemon shares this CPU and this spins from the first instant: the
    # main loop is a batch thread while no client is connected, so the HELLO
    # is read at once (at idle priority it was read after most of the run).
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        t = p.begin()
        s = 0
        for i in range(20000):
            s += i
        p.end("step", t, stage="spin", batch=1)
    p.close()
    """
)


def test_daemon_preempting_a_traced_thread_is_named_as_preemptor(tmp_path):
    """The engine and the daemon share one CPU while the daemon is kept busy
    by a flood from another CPU: the engine's preempted intervals name the
    daemon (its pid, a 'stallscope/...' thread name), as any other task."""
    from stallscope.probes.sched_bcc import BccSchedProbe

    reason = BccSchedProbe.unavailable()
    require_privileged(reason is None, f"requires root and bcc: {reason}")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    # The daemon is made to share the engine's CPU (it would otherwise keep
    # off it) and its probe socket reader, the one thread at normal priority,
    # is kept busy: a preemption by the tracer is named like any other.
    d = DaemonProcess(
        tmp_path, sched_backend="bcc", extra_args=["--no-keep-off-engine-cpus"]
    ).start()
    try:
        for tid in os.listdir(f"/proc/{d.proc.pid}/task"):
            os.sched_setaffinity(int(tid), {cpus[0]})
        engine = subprocess.Popen(
            [sys.executable, "-c", ENGINE, d.socket, "6"],
            preexec_fn=lambda: os.sched_setaffinity(0, {cpus[0]}),
        )
        time.sleep(1.0)  # the engine runs before the daemon gets busy
        senders = flood(d.socket, 3.0, senders=2, cpu=cpus[1])
        for p in senders:
            p.communicate()
        assert engine.wait(timeout=120) == 0
    finally:
        rc, _ = d.stop(timeout_s=120)
    assert rc == 0, d.read_log()
    rows = d.query(
        "SELECT preemptor_comm, count(*) FROM offcpu WHERE pid = ? AND preempted "
        "AND preemptor_pid = ? GROUP BY ALL",
        [engine.pid, d.proc.pid],
    )
    assert rows, d.query(
        "SELECT preemptor_pid, preemptor_comm, count(*) FROM offcpu WHERE pid = ? "
        "AND preempted GROUP BY ALL ORDER BY 3 DESC LIMIT 10",
        [engine.pid],
    )
    assert sum(n for comm, n in rows if comm.startswith("stallscope")) >= 0.9 * sum(
        n for _, n in rows
    ), rows
    named = d.scalar(
        "SELECT count(*) FROM step_attribution s JOIN runs r USING (run_id) "
        "WHERE r.pid = ? AND s.preemptor_pid = ?",
        [engine.pid, d.proc.pid],
    )
    assert named > 0


def test_probe_losses_share_one_insert_with_the_clients(tmp_path):
    """A probe's loss is a row of the flush's one `losses` INSERT (a statement
    per loss cost ~0.5 ms each), next to ingest's: every field kept, the
    probe's with no run."""
    s = store.Store(str(tmp_path / "l.duckdb"), flush_interval_s=3600)
    sink = server.StoreSink(s)
    try:
        sink.loss("cpu", 10, 20, 3, "native leaf only")
        sink.loss("sched", 30, 40, 1, "switch-in not reported")
        s.record_losses("client", [(7, 50, 60, 2, "sequence_gap")])
        assert s._statements == []  # no statement queued: rows only
        cur = s.cursor()
        got = cur.execute(
            "SELECT run_id, probe, start_ns, end_ns, count, reason, stored_ns > 0 "
            "FROM losses ORDER BY start_ns"
        ).fetchall()
        cur.close()
        assert got == [
            (None, "cpu", 10, 20, 3, "native leaf only", True),
            (None, "sched", 30, 40, 1, "switch-in not reported", True),
            (7, "client", 50, 60, 2, "sequence_gap", True),
        ]
        assert s.flushes == 1
    finally:
        s.close()
