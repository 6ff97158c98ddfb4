"""`stallscope export perfetto` on a real traced run, parsed back with
Perfetto's own protos (the `perfetto` package's TracePacket).

The run: tests/export/fleet_engine.py traced by a daemon with the eBPF
scheduling probe (off-CPU intervals, run-queue waits, migrations) and the
fake H200 behind the real NVML bindings (clock and power counters). The
trace must hold one process track, a thread track per traced thread, every
span as a slice with every begin ended on its own track in time order,
submits nested inside steps, slow steps named with their cause, GC passes,
off-CPU intervals, migrations and GPU counters in the database's numbers,
on CLOCK_MONOTONIC with a clock snapshot. Perfetto's trace_processor
downloads its binary at run time (these machines cannot), so no load test.
"""

import os
import subprocess
import sys
from collections import Counter, defaultdict

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pt

from export.conftest import run_engine
from helpers.daemonproc import DaemonProcess
from helpers.privileged import is_root, require_privileged
from helpers.waiting import wait_for

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

FAKE_NVML = (
    "from stallscope.testing import fake_nvml\nfake_nvml.install(fake_nvml.FakeNvml(gpus=1))"
)
MONOTONIC = pt.BuiltinClock.BUILTIN_CLOCK_MONOTONIC
REALTIME = pt.BuiltinClock.BUILTIN_CLOCK_REALTIME
BEGIN, END = pt.TrackEvent.TYPE_SLICE_BEGIN, pt.TrackEvent.TYPE_SLICE_END
INSTANT, COUNTER = pt.TrackEvent.TYPE_INSTANT, pt.TrackEvent.TYPE_COUNTER


def _bcc_ok():
    try:
        import bcc  # noqa: F401
    except ImportError:
        return False
    return os.path.isdir("/sys/kernel/tracing/events/sched")


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    require_privileged(
        is_root() and _bcc_ok(),
        "requires root, bcc (python3-bpfcc) and tracefs: run make test as root",
    )
    tmp_path = tmp_path_factory.mktemp("perfetto")
    api = str(tmp_path / "api.sock")
    daemon = DaemonProcess(
        tmp_path,
        sched_backend="bcc",
        preamble=FAKE_NVML,
        extra_args=["--gpu-backend", "nvml", "--gpu-poll-hz", "50", "--api-socket", api],
    ).start()
    try:
        # sleeps make blocked off-CPU intervals; full GC passes every 40 steps
        run_engine(daemon.socket, "perfetto", 400, 40, 25)
        # while the daemon holds the file: the trace through its Query API
        live = tmp_path / "live.pftrace"

        def exported_through_daemon():
            done = export(daemon.db, live, "--api-socket", api)
            return done.returncode == 0 and "spans 800" in done.stdout

        assert wait_for(exported_through_daemon, timeout_s=60, interval_s=0.5)
    finally:
        assert daemon.stop()[0] == 0
    path = tmp_path / "run.pftrace"
    done = export(daemon.db, path)
    assert done.returncode == 0, done.stderr
    return daemon, parse(path), parse(live)


def export(db, path, *more):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "stallscope.cli",
            "export",
            "perfetto",
            "--db",
            str(db),
            "-o",
            str(path),
            *more,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def parse(path):
    trace = pt.Trace()
    trace.ParseFromString(path.read_bytes())
    return trace


def tracks(trace):
    return {
        p.track_descriptor.uuid: p.track_descriptor
        for p in trace.packet
        if p.HasField("track_descriptor")
    }


def events(trace):
    """track uuid -> [(ts, type, name, args dict)] in file order."""
    out = defaultdict(list)
    for p in trace.packet:
        if p.HasField("track_event"):
            ev = p.track_event
            args = {}
            for a in ev.debug_annotations:
                kind = a.WhichOneof("value")
                args[a.name] = getattr(a, kind) if kind else None
            out[ev.track_uuid].append((p.timestamp, ev.type, ev.name, args, p.timestamp_clock_id))
    return out


def slices(evs):
    """(start, end, name, args, depth) of every slice on one track; asserts
    that the track's begins and ends pair up as a stack in time order."""
    stack, done, last = [], [], None
    for ts, kind, name, args, _ in evs:
        assert last is None or ts >= last, "events out of time order on a track"
        last = ts
        if kind == BEGIN:
            stack.append((ts, name, args, len(stack)))
        elif kind == END:
            assert stack, "an end without its begin"
            start, n, a, depth = stack.pop()
            done.append((start, ts, n, a, depth))
    assert not stack, "a begin without its end"
    return done


def test_trace_matches_the_database(traced):
    daemon, trace, _ = traced
    ((run_id, pid),) = daemon.query("SELECT run_id, pid FROM runs")
    descs = tracks(trace)
    evs = events(trace)

    # clock: a snapshot tying CLOCK_MONOTONIC to CLOCK_REALTIME; every event monotonic
    snaps = [p.clock_snapshot for p in trace.packet if p.HasField("clock_snapshot")]
    assert len(snaps) == 1 and snaps[0].primary_trace_clock == MONOTONIC
    clocks = {c.clock_id: c.timestamp for c in snaps[0].clocks}
    started, realtime = daemon.query("SELECT started_ns, realtime_ns FROM runs")[0]
    assert clocks == {MONOTONIC: started, REALTIME: realtime}
    assert {e[4] for track in evs.values() for e in track} == {MONOTONIC}

    # tracks: the process, its threads, their child tracks, GPU counters
    procs = [d for d in descs.values() if d.HasField("process")]
    assert [(d.process.pid, d.process.process_name) for d in procs] == [
        (pid, f"perfetto (run {run_id})")
    ]
    threads = {d.uuid: d.thread.tid for d in descs.values() if d.HasField("thread")}
    span_tids = {r[0] for r in daemon.query("SELECT DISTINCT tid FROM spans")}
    assert span_tids <= set(threads.values())
    assert all(d.thread.pid == pid for d in descs.values() if d.HasField("thread"))
    children = {
        d.uuid: (d.parent_uuid, d.name) for d in descs.values() if d.HasField("parent_uuid")
    }
    assert all(parent in threads for parent, _ in children.values())

    # every track: balanced, in time order; spans and their nesting
    by_track = {uuid: slices(e) for uuid, e in evs.items()}
    step_tracks = [u for u in threads if any(s[2].startswith("step") for s in by_track.get(u, []))]
    span_slices = [s for u in threads for s in by_track.get(u, [])]
    span_slices += [
        s for u, (_, name) in children.items() if name.startswith("spans ") for s in by_track[u]
    ]
    kinds = Counter(s[2].split(" ")[0] for s in span_slices)
    assert kinds == Counter(dict(daemon.query("SELECT kind, count(*) FROM spans GROUP BY kind")))
    assert kinds["step"] == 400 and step_tracks
    steps = [s for s in span_slices if s[2].startswith("step")]
    submits = [s for s in span_slices if s[2] == "submit"]
    assert all(s[4] == 0 for s in steps) and all(s[4] == 1 for s in submits)
    assert all(s[3]["stage"] == "decode" and s[3]["batch"] in (4, 8) for s in steps)
    # slow steps carry their cause, in the name the UI's search finds
    want_slow = Counter(
        dict(daemon.query("SELECT cause, count(*) FROM step_attribution WHERE slow GROUP BY cause"))
    )
    got_slow = Counter(s[3]["cause"] for s in steps if s[3].get("slow"))
    assert got_slow == want_slow and sum(want_slow.values()) > 0
    assert all(s[2] == f"step (slow: {s[3]['cause']})" for s in steps if s[3].get("slow"))
    assert all("excess_ns" in s[3] for s in steps)

    def on(name):
        return [s for u, (_, n) in children.items() if n == name for s in by_track.get(u, [])]

    gc = on("gc")
    assert sorted((s[0], s[1], s[3]["generation"], s[3]["collected"]) for s in gc) == sorted(
        daemon.query("SELECT start_ns, end_ns, generation, collected FROM gc_events")
    )
    assert sum(1 for s in gc if s[3]["generation"] == 2) == 10

    begin, end = daemon.query("SELECT connected_ns, ended_ns FROM runs")[0]
    window = [pid, begin, end]
    off = on("off-cpu")
    want_off = daemon.query(
        "SELECT count(*) FILTER (preempted AND NOT coalesce(yielded, false)), "
        "count(*) FILTER (yielded), count(*) FILTER (NOT preempted) FROM offcpu "
        "WHERE pid = ? AND resolution_ns IS NULL AND end_ns >= ? AND start_ns <= ?",
        window,
    )[0]
    named = Counter(s[2] for s in off)
    assert (named["preempted"], named["yielded"], named["blocked"]) == want_off
    assert want_off[2] >= 16  # at least the engine's 5 ms sleeps
    assert len(on("runqueue")) == daemon.scalar(
        "SELECT count(*) FROM runq WHERE pid = ? AND resolution_ns IS NULL "
        "AND end_ns >= ? AND start_ns <= ?",
        window,
    )
    moves = [e for u, (_, n) in children.items() if n == "migrations" for e in evs[u]]
    assert all(e[1] == INSTANT for e in moves)
    assert len(moves) == daemon.scalar(
        "SELECT count(*) FROM migrations WHERE pid = ? AND resolution_ns IS NULL "
        "AND ts_ns >= ? AND ts_ns <= ?",
        window,
    )

    # GPU counters: the fake H200's polls inside the run, per counter
    counters = {d.uuid: d.name for d in descs.values() if d.HasField("counter")}
    assert set(counters.values()) >= {"GPU 0 SM clock (MHz)", "GPU 0 power (mW)"}
    for uuid, name in counters.items():
        column = {"SM clock": "sm_clock_mhz", "memory clock": "mem_clock_mhz", "power": "power_mw"}[
            name.split(" ", 2)[2].rsplit(" (", 1)[0]
        ]
        points = [(e[0], e[3]) for e in evs[uuid]]
        assert all(e[1] == COUNTER for e in evs[uuid])
        assert [p[0] for p in points] == sorted(p[0] for p in points)
        assert (
            len(points)
            == daemon.scalar(
                f"SELECT count({column}) FROM nvml_samples WHERE ts_ns >= ? AND ts_ns <= ?",
                [begin, end],
            )
            > 0
        )


def test_trace_through_the_daemon_has_the_same_slices(traced):
    _, from_file, through_daemon = traced

    def slice_names(trace):
        evs = events(trace)
        return Counter(s[2].split(" ")[0] for e in evs.values() for s in slices(e))

    got = slice_names(through_daemon)
    assert got["step"] == 400 and got["submit"] == 400
    assert got["gc"] == slice_names(from_file)["gc"]


def test_unknown_run_is_a_clear_error(traced):
    daemon = traced[0]
    done = export(daemon.db, daemon.dir / "x.pftrace", "--run", "99")
    assert done.returncode == 2 and "error: perfetto export: no run 99" in done.stderr


def test_run_and_time_window_select_what_overlaps(traced):
    daemon = traced[0]
    lo, hi = daemon.query(
        "SELECT quantile_disc(start_ns, 0.25), quantile_disc(start_ns, 0.5) FROM spans "
        "WHERE kind = 'step'"
    )[0]
    path = daemon.dir / "window.pftrace"
    done = export(daemon.db, path, "--run", "1", "--from", str(lo), "--to", str(hi))
    assert done.returncode == 0, done.stderr
    evs = events(parse(path))
    names = Counter(s[2].split(" ")[0] for e in evs.values() for s in slices(e))
    want = dict(
        daemon.query(
            "SELECT kind, count(*) FROM spans WHERE end_ns >= ? AND start_ns <= ? GROUP BY kind",
            [lo, hi],
        )
    )
    assert names["step"] == want["step"] and names["submit"] == want["submit"]
    assert 50 <= want["step"] <= 150  # about a quarter of the 400 steps
    assert names["gc"] == daemon.scalar(
        "SELECT count(*) FROM gc_events WHERE end_ns >= ? AND start_ns <= ?", [lo, hi]
    )
