"""Turns stored batches (pa.Table per store table) into protobuf events.

Runs on a subscriber's stream thread, never on a producer's. Columns are
read whole (`to_pylist` per column) and zipped, so the cost is one protobuf
message per event and no per-cell Arrow access. NULLs become the field's
documented "unknown" value (0, "" or -1, as the proto says).

A column may be absent from a batch only where `OPTIONAL` says so (the
exact scheduling probes send no window counters, the USDT GC probe no
`uncollectable`); any other missing column is a producer and the schema
disagreeing (a renamed column would otherwise stream zeros). Then
`to_events` raises `MissingColumns`, or, given `on_missing` (the daemon's
stream), reports the columns to it and fills the documented unknowns.
"""

from stallscope.api.v1 import stallscope_pb2 as pb

# Columns a batch of each kind may lack by design (the producer does not
# have them); every other column a converter reads must be there.
OPTIONAL = {
    pb.SPAN: frozenset(),
    pb.GC_PASS: frozenset({"uncollectable", "seq"}),  # the USDT probe has neither
    # exact rows (bcc, perf) have no window counters; /proc rows no preempted flag
    pb.OFF_CPU: frozenset({"resolution_ns", "offcpu_ns", "events", "preempted_events"}),
    pb.RUN_QUEUE: frozenset({"resolution_ns", "wait_ns", "events"}),
    pb.MIGRATION: frozenset({"resolution_ns", "events"}),
    pb.GPU_SAMPLE: frozenset({"source"}),
    pb.STALL_ALERT: frozenset(),
    pb.HUNG: frozenset(),
    pb.REQUEST_FINISHED: frozenset(),
}


class MissingColumns(ValueError):
    """A batch lacks columns its kind must have (`kind`, `columns`)."""

    def __init__(self, kind, columns):
        super().__init__(
            f"{pb.EventKind.Name(kind)} batch lacks column(s) {', '.join(columns)}: "
            "the producer and the schema disagree"
        )
        self.kind = kind
        self.columns = tuple(columns)


class _Columns:
    """Reads whole columns of one batch; a missing column is optional, reported
    (`on_missing`) or raised."""

    def __init__(self, kind, batch, on_missing):
        self.kind, self.batch, self.on_missing = kind, batch, on_missing
        self.missing = []

    def __call__(self, name, default=None):
        batch = self.batch
        if name in batch.column_names:
            return batch[name].to_pylist()
        if name not in OPTIONAL[self.kind]:
            if self.on_missing is None:
                raise MissingColumns(self.kind, [name])
            self.missing.append(name)
        return [default] * batch.num_rows


def _nz(v, default=0):
    return default if v is None else v


def spans(col, runs):
    out = []
    for run_id, tid, kind, stage, size, s, e, depth, seq in zip(
        col("run_id"),
        col("tid"),
        col("kind"),
        col("stage"),
        col("batch"),
        col("start_ns"),
        col("end_ns"),
        col("depth", 0),
        col("seq", 0),
        strict=True,
    ):
        out.append(
            pb.Event(
                span=pb.Span(
                    run_id=_nz(run_id),
                    pid=_nz(runs.get(run_id)),
                    tid=_nz(tid),
                    kind=kind or "",
                    stage=stage or "",
                    batch=_nz(size),
                    start_ns=_nz(s),
                    end_ns=_nz(e),
                    duration_ns=_nz(e) - _nz(s),
                    depth=_nz(depth),
                    seq=_nz(seq),
                )
            )
        )
    return out


def gc_passes(col, runs):
    out = []
    for run_id, tid, gen, s, e, collected, unc in zip(
        col("run_id"),
        col("tid"),
        col("generation"),
        col("start_ns"),
        col("end_ns"),
        col("collected"),
        col("uncollectable"),
        strict=True,
    ):
        out.append(
            pb.Event(
                gc_pass=pb.GcPass(
                    run_id=_nz(run_id),
                    pid=_nz(runs.get(run_id)),
                    tid=_nz(tid),
                    generation=_nz(gen, -1),
                    start_ns=_nz(s),
                    end_ns=_nz(e),
                    duration_ns=_nz(e) - _nz(s),
                    collected=_nz(collected),
                    uncollectable=_nz(unc),
                )
            )
        )
    return out


def off_cpu(col, runs):
    out = []
    for pid, tid, s, e, pre, cpu, res, off_ns, n, n_pre in zip(
        col("pid"),
        col("tid"),
        col("start_ns"),
        col("end_ns"),
        col("preempted"),
        col("cpu"),
        col("resolution_ns"),
        col("offcpu_ns"),
        col("events"),
        col("preempted_events"),
        strict=True,
    ):
        out.append(
            pb.Event(
                off_cpu=pb.OffCpu(
                    pid=_nz(pid),
                    tid=_nz(tid),
                    start_ns=_nz(s),
                    end_ns=_nz(e),
                    duration_ns=_nz(e) - _nz(s),
                    preempted=bool(pre),
                    cpu=_nz(cpu, -1),
                    resolution_ns=_nz(res),
                    window_offcpu_ns=_nz(off_ns),
                    window_events=_nz(n),
                    window_preempted_events=_nz(n_pre),
                )
            )
        )
    return out


def run_queue(col, runs):
    out = []
    for pid, tid, s, e, cpu, res, wait_ns, n in zip(
        col("pid"),
        col("tid"),
        col("start_ns"),
        col("end_ns"),
        col("cpu"),
        col("resolution_ns"),
        col("wait_ns"),
        col("events"),
        strict=True,
    ):
        out.append(
            pb.Event(
                run_queue=pb.RunQueueWait(
                    pid=_nz(pid),
                    tid=_nz(tid),
                    start_ns=_nz(s),
                    end_ns=_nz(e),
                    duration_ns=_nz(e) - _nz(s),
                    cpu=_nz(cpu, -1),
                    resolution_ns=_nz(res),
                    window_wait_ns=_nz(wait_ns),
                    window_events=_nz(n),
                )
            )
        )
    return out


def migrations(col, runs):
    out = []
    for pid, tid, ts, a, b, res, n in zip(
        col("pid"),
        col("tid"),
        col("ts_ns"),
        col("from_cpu"),
        col("to_cpu"),
        col("resolution_ns"),
        col("events"),
        strict=True,
    ):
        out.append(
            pb.Event(
                migration=pb.Migration(
                    pid=_nz(pid),
                    tid=_nz(tid),
                    ts_ns=_nz(ts),
                    from_cpu=_nz(a, -1),
                    to_cpu=_nz(b, -1),
                    resolution_ns=_nz(res),
                    window_events=_nz(n),
                )
            )
        )
    return out


def gpu_samples(col, runs):
    out = []
    for gpu, ts, sm, mem, power, temp, util, reasons, source in zip(
        col("gpu"),
        col("ts_ns"),
        col("sm_clock_mhz"),
        col("mem_clock_mhz"),
        col("power_mw"),
        col("temp_c"),
        col("util_pct"),
        col("clock_event_reasons"),
        col("source"),
        strict=True,
    ):
        out.append(
            pb.Event(
                gpu_sample=pb.GpuSample(
                    gpu=_nz(gpu),
                    ts_ns=_nz(ts),
                    sm_clock_mhz=_nz(sm, -1),
                    mem_clock_mhz=_nz(mem, -1),
                    power_mw=_nz(power, -1),
                    temp_c=_nz(temp, -1),
                    util_pct=_nz(util, -1),
                    clock_event_reasons=_nz(reasons),
                    source=source or "poll",
                )
            )
        )
    return out


def stall_alerts(col, runs):
    fields = [f.name for f in pb.StallAlert.DESCRIPTOR.fields]
    present = [f for f in fields if f in col.batch.column_names]
    for name in sorted(set(fields) - set(present)):
        col(name)  # raises or reports: alerts carry every field
    rows = col.batch.select(present).to_pylist()
    return [pb.Event(stall_alert=pb.StallAlert(**row)) for row in rows]


def hung(col, runs):
    fields = [f.name for f in pb.Hung.DESCRIPTOR.fields]
    present = [f for f in fields if f in col.batch.column_names]
    for name in sorted(set(fields) - set(present)):
        col(name)  # raises or reports: the watchdog's rows carry every field
    rows = col.batch.select(present).to_pylist()
    return [pb.Event(hung=pb.Hung(**{k: v for k, v in r.items() if v is not None})) for r in rows]


def request_finished(col, runs):
    fields = [f.name for f in pb.RequestFinished.DESCRIPTOR.fields if f.name != "pid"]
    present = [f for f in fields if f in col.batch.column_names]
    for name in sorted(set(fields) - set(present)):
        col(name)  # raises or reports: the feed's rows carry every field
    rows = col.batch.select(present).to_pylist()
    return [
        pb.Event(request_finished=pb.RequestFinished(pid=_nz(runs.get(r["run_id"])), **r))
        for r in rows
    ]


CONVERTERS = {
    pb.SPAN: spans,
    pb.GC_PASS: gc_passes,
    pb.OFF_CPU: off_cpu,
    pb.RUN_QUEUE: run_queue,
    pb.MIGRATION: migrations,
    pb.GPU_SAMPLE: gpu_samples,
    pb.STALL_ALERT: stall_alerts,
    pb.HUNG: hung,
    pb.REQUEST_FINISHED: request_finished,
}


def to_events(kind, batch, runs, on_missing=None):
    """Events of one batch of `kind`; `on_missing(kind, columns)` instead of
    MissingColumns for columns the kind must have (then: unknown values)."""
    col = _Columns(kind, batch, on_missing)
    out = CONVERTERS[kind](col, runs)
    if col.missing:
        on_missing(kind, tuple(dict.fromkeys(col.missing)))
    return out
