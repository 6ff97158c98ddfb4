"""A Perfetto trace of traced runs: `stallscope export perfetto`.

`write_trace(source, path, run_ids, from_ns, to_ns)` reads the database
through `source` (analysis.access: the file, or a running daemon's Query) and
writes Perfetto's protobuf trace format (the TracePacket protos that the
`perfetto` package ships) for the Perfetto UI or trace_processor:
- one process track per run (pid, label) and one thread track per traced
  thread; the client's spans (steps, submits, collects, ...) as nested
  slices on it, args stage, batch; steps also baseline, excess and, when
  slow, their cause (named `step (slow: CAUSE)` so the UI's search finds
  them). Spans that do not nest in the ones before them (async code) go to
  child tracks `spans 1`, `spans 2`, ... so that no track has a slice
  crossing another;
- the CPU sampler's samples as instants named `cpu sample` on the thread
  track itself, each with its callstack (TrackEvent's inline callstack,
  root frame first; Python frames `function` at `file:line`, the native leaf
  `function [module]`), args kernel_mode and cpu;
- child tracks of each thread: `gc` (passes: generation, collected),
  `off-cpu` (preempted/yielded/blocked, with preemptor or waker), `runqueue`
  (waits for a CPU) and `migrations` (instants, from and to CPU);
- a `requests (run N)` track per run with a child track per request (at
  most MAX_REQUEST_TRACKS, the longest inter-token gap first): a slice from
  its first to its last event (args ttft_ns, itl_max_ns, worst_cause), an
  instant per event, and a flow from each token event to the step slice
  that held it;
- counter tracks per GPU: SM and memory clocks (MHz), power (mW);
- everything on CLOCK_MONOTONIC (every packet says so) with a clock
  snapshot that ties it to CLOCK_REALTIME from the first run's anchor.
The kernel rows of the /proc fallback (sampled windows, resolution_ns set)
are totals, not intervals, and are left out. Nothing here writes to the
database.
"""

import itertools

from stallscope.errors import StallscopeError

try:  # one place imports the protos and says how to get them
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pt
    from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder
except ImportError:  # pragma: no cover - the daemon extra installs it
    pt = None

MONOTONIC = 3  # BuiltinClock.BUILTIN_CLOCK_MONOTONIC
REALTIME = 1  # BuiltinClock.BUILTIN_CLOCK_REALTIME
SEQUENCE_ID = 1
MAX_REQUEST_TRACKS = 256  # per run: the requests with the longest inter-token gap
GPU_COUNTERS = (
    ("sm_clock_mhz", "SM clock", "MHz"),
    ("mem_clock_mhz", "memory clock", "MHz"),
    ("power_mw", "power", "mW"),
)


class PerfettoError(StallscopeError):
    heading = "perfetto export"


class _Writer:
    """Packets to a file, with track uuids handed out in order."""

    def __init__(self, f):
        self.builder = StreamingTraceProtoBuilder(f)
        self._uuids = itertools.count(1)
        self.thread_tracks = {}  # (run_id, tid) -> track uuid
        self.flow_ids = itertools.count(1)  # request token -> step flows
        self.packets = 0
        self.first = True

    def packet(self):
        p = self.builder.create_packet()
        p.trusted_packet_sequence_id = SEQUENCE_ID
        if self.first:
            p.sequence_flags = pt.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self.first = False
        return p

    def write(self, p):
        self.builder.write_packet(p)
        self.packets += 1

    def track(self, fill):
        uuid = next(self._uuids)
        p = self.packet()
        p.track_descriptor.uuid = uuid
        fill(p.track_descriptor)
        self.write(p)
        return uuid

    def event(self, track, ts_ns, kind, name=None, args=(), counter=None, callstack=None,
              flows=()):  # fmt: skip
        p = self.packet()
        p.timestamp = int(ts_ns)
        p.timestamp_clock_id = MONOTONIC
        ev = p.track_event
        ev.type = kind
        ev.track_uuid = track
        if name is not None:
            ev.name = name
        if counter is not None:
            ev.counter_value = int(counter)
        ev.flow_ids.extend(flows)
        for function, source_file, line in callstack or ():
            fr = ev.callstack.frames.add()
            fr.function_name = function
            if source_file:
                fr.source_file = source_file
            if line is not None:
                fr.line_number = int(line)
        for key, value in args:
            if value is None:
                continue
            a = ev.debug_annotations.add()
            a.name = key
            if isinstance(value, bool):
                a.bool_value = value
            elif isinstance(value, int):
                a.int_value = value
            elif isinstance(value, float):
                a.double_value = value
            else:
                a.string_value = str(value)
        self.write(p)


def _rows(source, sql, params=()):
    columns, rows = source.query(sql, list(params))
    return [dict(zip(columns, r, strict=True)) for r in rows]


def _emit_nested(w, track_of_lane, items):
    """Begin/end events for intervals (start, end, name, args) on lanes: each
    interval goes to the first lane where it nests inside the open ones;
    every begin has its end on the same track, in time order."""
    lanes = []  # per lane: stack of open ends
    items = sorted(items, key=lambda it: (it[0], -it[1]))
    for start, end, name, args, *flows in items:
        lane = None
        for i, stack in enumerate(lanes):
            while stack and stack[-1] <= start:
                w.event(track_of_lane(i), stack.pop(), pt.TrackEvent.TYPE_SLICE_END)
            if not stack or end <= stack[-1]:
                lane = i
                break
        if lane is None:
            lanes.append([])
            lane = len(lanes) - 1
        w.event(track_of_lane(lane), start, pt.TrackEvent.TYPE_SLICE_BEGIN, name, args,
                flows=flows[0] if flows else ())  # fmt: skip
        lanes[lane].append(end)
    for i, stack in enumerate(lanes):
        while stack:
            w.event(track_of_lane(i), stack.pop(), pt.TrackEvent.TYPE_SLICE_END)


def _select_runs(source, run_ids):
    where, params = "", []
    if run_ids:
        where = f"WHERE run_id IN ({', '.join('?' for _ in run_ids)})"
        params = list(run_ids)
    runs = _rows(
        source,
        "SELECT run_id, pid, label, started_ns, realtime_ns, connected_ns, ended_ns, argv "
        f"FROM runs {where} ORDER BY run_id",
        params,
    )
    missing = set(run_ids or ()) - {r["run_id"] for r in runs}
    if missing:
        raise PerfettoError(f"no run {', '.join(map(str, sorted(missing)))} in the database")
    if not runs:
        raise PerfettoError("the database holds no run")
    return runs


def write_trace(source, path, run_ids=None, from_ns=None, to_ns=None):
    """Write the trace; returns counts of what went in (tracks, slices, ...)."""
    if pt is None:
        raise PerfettoError("the perfetto package is missing: pip install perfetto")
    runs = _select_runs(source, run_ids)
    lo = from_ns if from_ns is not None else -(2**63)
    hi = to_ns if to_ns is not None else 2**63 - 1
    counts = dict.fromkeys(
        ("runs", "threads", "spans", "gc", "offcpu", "runq", "migrations", "cpu_samples"), 0
    )
    counts["counters"] = 0
    counts.update(requests=0, request_events=0, request_flows=0)
    with open(path, "wb") as f:
        w = _Writer(f)
        anchor = next((r for r in runs if r["realtime_ns"] and r["started_ns"]), None)
        p = w.packet()
        p.timestamp = int(anchor["started_ns"]) if anchor else 0
        p.timestamp_clock_id = MONOTONIC
        p.clock_snapshot.primary_trace_clock = MONOTONIC
        if anchor:
            for clock_id, ts in (
                (MONOTONIC, anchor["started_ns"]),
                (REALTIME, anchor["realtime_ns"]),
            ):
                c = p.clock_snapshot.clocks.add()
                c.clock_id = clock_id
                c.timestamp = int(ts)
        w.write(p)
        for run in runs:
            _write_run(source, w, run, lo, hi, counts)
        _write_gpu(source, w, runs, lo, hi, counts)
        counts["packets"] = w.packets
    return counts


def _write_run(source, w, run, lo, hi, counts):
    pid, run_id = run["pid"], run["run_id"]
    name = run["label"] or (run["argv"][0] if run["argv"] else f"run {run_id}")

    def process(t):
        t.process.pid = pid
        t.process.process_name = f"{name} (run {run_id})"

    w.track(process)
    counts["runs"] += 1
    begin = run["connected_ns"] or run["started_ns"] or lo
    end = run["ended_ns"] or hi
    span_rows = _rows(
        source,
        "SELECT s.tid, s.kind, s.stage, s.batch, s.start_ns, s.end_ns, a.slow, a.cause, "
        "a.excess_ns, a.baseline_ns, a.code_frame, a.code_ns, "
        "array_to_string(a.cpu_slow_evidence, ',') AS cpu_slow_evidence FROM spans s LEFT JOIN step_attribution a "
        "ON s.kind = 'step' AND a.run_id = s.run_id AND a.tid = s.tid AND a.start_ns = s.start_ns "
        "AND a.end_ns = s.end_ns WHERE s.run_id = ? AND s.end_ns >= ? AND s.start_ns <= ? "
        "AND s.end_ns >= s.start_ns",
        [run_id, lo, hi],
    )
    gc_rows = _rows(
        source,
        "SELECT tid, generation, start_ns, end_ns, collected, uncollectable FROM gc_events "
        "WHERE run_id = ? AND end_ns >= ? AND start_ns <= ? AND end_ns >= start_ns",
        [run_id, lo, hi],
    )
    kernel = {"offcpu": [], "runq": [], "migrations": [], "cpu_samples": []}
    stacks = {}
    if pid is not None:
        window = [pid, max(lo, begin), min(hi, end)]
        kernel["offcpu"] = _rows(
            source,
            # every column: `yielded` is absent from databases written before it
            "SELECT * FROM offcpu WHERE pid = ? AND resolution_ns IS NULL "
            "AND end_ns >= ? AND start_ns <= ? AND end_ns >= start_ns",
            window,
        )
        kernel["runq"] = _rows(
            source,
            "SELECT tid, start_ns, end_ns, cpu FROM runq WHERE pid = ? AND resolution_ns IS NULL "
            "AND end_ns >= ? AND start_ns <= ? AND end_ns >= start_ns",
            window,
        )
        kernel["migrations"] = _rows(
            source,
            "SELECT tid, ts_ns, from_cpu, to_cpu FROM migrations WHERE pid = ? "
            "AND resolution_ns IS NULL AND ts_ns >= ? AND ts_ns <= ?",
            window,
        )
        kernel["cpu_samples"] = _rows(
            source,
            "SELECT tid, ts_ns, cpu, stack_id, kernel_mode FROM cpu_samples WHERE pid = ? "
            "AND ts_ns >= ? AND ts_ns <= ? ORDER BY ts_ns",
            window,
        )
        stacks = _callstacks(source, window)
    step_flows = _write_requests(source, w, run, lo, hi, counts)
    tids = sorted(
        {r["tid"] for r in span_rows + gc_rows}
        | {r["tid"] for rows in kernel.values() for r in rows}
    )
    for tid in tids:
        _write_thread(w, run, tid, span_rows, gc_rows, kernel, counts, step_flows)
        _write_samples(w, w.thread_tracks[(run["run_id"], tid)], tid, kernel, stacks, counts)


def _callstacks(source, window):
    """stack_id -> [(function, file, line)], root frame first, of the
    samples of process window[0] in [window[1], window[2]]."""
    rows = _rows(
        source,
        "SELECT st.stack_id, st.depth, f.kind, f.file, f.function, f.line FROM cpu_stacks st "
        "JOIN cpu_frames f USING (frame_id) WHERE st.stack_id IN (SELECT DISTINCT stack_id "
        "FROM cpu_samples WHERE pid = ? AND ts_ns >= ? AND ts_ns <= ?) "
        "ORDER BY st.stack_id, st.depth DESC",
        window,
    )
    out = {}
    for r in rows:
        if r["kind"] == "native":
            module = (r["file"] or "?").rsplit("/", 1)[-1]
            frame = (f"{r['function'] or '[unknown]'} [{module}]", r["file"], None)
        else:
            frame = (r["function"] or "<unknown>", r["file"], r["line"])
        out.setdefault(r["stack_id"], []).append(frame)
    return out


def _write_samples(w, track, tid, kernel, stacks, counts):
    """The CPU sampler's samples of one thread: instants with their callstack."""
    n = 0
    for r in kernel["cpu_samples"]:
        if r["tid"] != tid:
            continue
        args = [("cpu", r["cpu"]), ("kernel_mode", bool(r["kernel_mode"]))]
        w.event(
            track,
            r["ts_ns"],
            pt.TrackEvent.TYPE_INSTANT,
            "cpu sample",
            args,
            callstack=stacks.get(r["stack_id"], ()),
        )
        n += 1
    counts["cpu_samples"] += n


def _write_requests(source, w, run, lo, hi, counts):
    """A track per request (at most MAX_REQUEST_TRACKS a run: those with the
    longest inter-token gap first) under a `requests` track of the run's
    process: a slice from its first to its last event, an instant per event,
    and a flow from each token event to the step that held it. Returns
    {(tid, step start): [flow ids]} for those steps' slices."""
    run_id = run["run_id"]
    chosen = _rows(
        source,
        "SELECT l.request_id, coalesce(l.text, l.request_id::VARCHAR) AS name, l.ttft_ns, "
        "l.itl_max_ns, l.worst_cause, l.end_event FROM request_latency l "
        "JOIN requests r USING (run_id, request_id) "
        "WHERE l.run_id = ? AND r.last_ns >= ? AND r.first_ns <= ? "
        "ORDER BY l.itl_max_ns DESC NULLS LAST, l.request_id LIMIT ?",
        [run_id, lo, hi, MAX_REQUEST_TRACKS],
    )
    if not chosen:
        return {}
    events = _rows(
        source,
        "SELECT request_id, event, ts_ns, tokens, tid, step_start_ns FROM request_steps "
        "WHERE run_id = ? AND ts_ns >= ? AND ts_ns <= ? "
        "AND request_id IN (SELECT unnest(?::VARCHAR[])::UBIGINT) ORDER BY ts_ns, seq",
        [run_id, lo, hi, [str(c["request_id"]) for c in chosen]],
    )
    pid = run["pid"] if run["pid"] is not None else -run_id

    def parent(t):
        t.name = f"requests (run {run_id})"
        t.process.pid = pid

    root = w.track(parent)
    by_request = {}
    for e in events:
        by_request.setdefault(e["request_id"], []).append(e)
    step_flows = {}
    for c in chosen:
        evs = by_request.get(c["request_id"], [])
        if not evs:
            continue

        def fill(t, name=c["name"]):
            t.parent_uuid = root
            t.name = f"request {name}"

        track = w.track(fill)
        args = [("ttft_ns", c["ttft_ns"]), ("itl_max_ns", c["itl_max_ns"]),
                ("worst_cause", c["worst_cause"]), ("end_event", c["end_event"])]  # fmt: skip
        w.event(
            track, evs[0]["ts_ns"], pt.TrackEvent.TYPE_SLICE_BEGIN, f"request {c['name']}", args
        )
        for e in evs:
            flows = ()
            if e["event"] == "token" and e["step_start_ns"] is not None:
                flows = (next(w.flow_ids),)
                step_flows.setdefault((e["tid"], e["step_start_ns"]), []).extend(flows)
            w.event(track, e["ts_ns"], pt.TrackEvent.TYPE_INSTANT, e["event"],
                    [("tokens", e["tokens"])], flows=flows)  # fmt: skip
            counts["request_events"] += 1
            counts["request_flows"] += len(flows)
        w.event(track, evs[-1]["ts_ns"], pt.TrackEvent.TYPE_SLICE_END)
        counts["requests"] += 1
    return step_flows


def _write_thread(w, run, tid, span_rows, gc_rows, kernel, counts, step_flows=None):
    pid = run["pid"] if run["pid"] is not None else -run["run_id"]

    def thread(t):
        t.thread.pid = pid
        t.thread.tid = int(tid)
        t.thread.thread_name = f"tid {tid}"

    thread_uuid = w.track(thread)
    w.thread_tracks[(run["run_id"], tid)] = thread_uuid
    counts["threads"] += 1
    children = {}

    def child(name):
        if name not in children:

            def fill(t):
                t.parent_uuid = thread_uuid
                t.name = name

            children[name] = w.track(fill)
        return children[name]

    spans = []
    for r in (r for r in span_rows if r["tid"] == tid):
        name = r["kind"]
        args = [("stage", r["stage"]), ("batch", r["batch"])]
        if r["kind"] == "step" and r["baseline_ns"] is not None:
            args += [("baseline_ns", r["baseline_ns"]), ("excess_ns", r["excess_ns"])]
            if r["slow"]:
                name = f"step (slow: {r['cause']})"
                args += [("slow", True), ("cause", r["cause"])]
                # the frame holding the on-CPU excess, and what says the CPU gave less
                if r["code_frame"] is not None:
                    args += [("code_frame", r["code_frame"]), ("code_ns", r["code_ns"])]
                if r["cpu_slow_evidence"]:
                    args += [("cpu_slow_evidence", r["cpu_slow_evidence"])]
        flows = (step_flows or {}).get((tid, r["start_ns"]), ()) if r["kind"] == "step" else ()
        spans.append((r["start_ns"], r["end_ns"], name, args, flows))
    counts["spans"] += len(spans)
    _emit_nested(w, lambda lane: thread_uuid if lane == 0 else child(f"spans {lane}"), spans)

    passes = [
        (
            r["start_ns"],
            r["end_ns"],
            f"gc gen{r['generation']}",
            [
                ("generation", r["generation"]),
                ("collected", r["collected"]),
                ("uncollectable", r["uncollectable"]),
            ],
        )
        for r in gc_rows
        if r["tid"] == tid
    ]
    counts["gc"] += len(passes)
    _emit_nested(w, lambda lane: child("gc" if lane == 0 else f"gc {lane}"), passes)

    off = []
    for r in (r for r in kernel["offcpu"] if r["tid"] == tid):
        if r["preempted"]:
            # the task switched in: a preemptor, or what the thread yielded to
            args = [("cpu", r["cpu"]), ("preemptor_pid", r["preemptor_pid"])]
            args.append(("preemptor_comm", r["preemptor_comm"]))
            name = "yielded" if r.get("yielded") else "preempted"
            off.append((r["start_ns"], r["end_ns"], name, args))
        else:
            args = [("cpu", r["cpu"]), ("waker_tid", r["waker_tid"])]
            args += [("waker_comm", r["waker_comm"]), ("waker_irq", r["waker_irq"])]
            off.append((r["start_ns"], r["end_ns"], "blocked", args))
    counts["offcpu"] += len(off)
    _emit_nested(w, lambda lane: child("off-cpu" if lane == 0 else f"off-cpu {lane}"), off)

    waits = [
        (r["start_ns"], r["end_ns"], "runqueue", [("cpu", r["cpu"])])
        for r in kernel["runq"]
        if r["tid"] == tid
    ]
    counts["runq"] += len(waits)
    _emit_nested(w, lambda lane: child("runqueue" if lane == 0 else f"runqueue {lane}"), waits)

    moves = sorted(
        (r["ts_ns"], r["from_cpu"], r["to_cpu"]) for r in kernel["migrations"] if r["tid"] == tid
    )
    for ts, from_cpu, to_cpu in moves:
        args = [("from_cpu", from_cpu), ("to_cpu", to_cpu)]
        w.event(child("migrations"), ts, pt.TrackEvent.TYPE_INSTANT, "migration", args)
    counts["migrations"] += len(moves)


def _write_gpu(source, w, runs, lo, hi, counts):
    """NVML counters over the selected runs' time."""
    begin = min((r["connected_ns"] or r["started_ns"] or lo) for r in runs)
    end = max((r["ended_ns"] or hi) for r in runs)
    rows = _rows(
        source,
        "SELECT gpu, ts_ns, sm_clock_mhz, mem_clock_mhz, power_mw FROM nvml_samples "
        "WHERE ts_ns >= ? AND ts_ns <= ? ORDER BY gpu, ts_ns",
        [max(lo, begin), min(hi, end)],
    )
    for gpu, group in itertools.groupby(rows, key=lambda r: r["gpu"]):
        group = list(group)
        for column, title, unit in GPU_COUNTERS:
            points = [(r["ts_ns"], r[column]) for r in group if r[column] is not None]
            if not points:
                continue

            def fill(t, title=title, unit=unit, gpu=gpu):
                t.name = f"GPU {gpu} {title} ({unit})"
                t.counter.unit_name = unit

            track = w.track(fill)
            for ts, value in points:
                w.event(track, ts, pt.TrackEvent.TYPE_COUNTER, counter=value)
            counts["counters"] += len(points)
