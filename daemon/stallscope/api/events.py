"""Turns stored batches (pa.Table per store table) into protobuf events.

Runs on a subscriber's stream thread, never on a producer's. Columns are
read whole (`to_pylist` per column) and zipped, so the cost is one protobuf
message per event and no per-cell Arrow access. NULLs become the field's
documented "unknown" value (0, "" or -1, as the proto says).
"""

from stallscope.api.v1 import stallscope_pb2 as pb


def _col(batch, name, default=None, n=None):
    if name in batch.column_names:
        return batch[name].to_pylist()
    return [default] * (n if n is not None else batch.num_rows)


def _nz(v, default=0):
    return default if v is None else v


def spans(batch, runs):
    n = batch.num_rows
    out = []
    for run_id, tid, kind, stage, size, s, e, depth, seq in zip(
        _col(batch, "run_id"),
        _col(batch, "tid"),
        _col(batch, "kind"),
        _col(batch, "stage"),
        _col(batch, "batch"),
        _col(batch, "start_ns"),
        _col(batch, "end_ns"),
        _col(batch, "depth", 0, n),
        _col(batch, "seq", 0, n),
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


def gc_passes(batch, runs):
    out = []
    for run_id, tid, gen, s, e, col, unc in zip(
        _col(batch, "run_id"),
        _col(batch, "tid"),
        _col(batch, "generation"),
        _col(batch, "start_ns"),
        _col(batch, "end_ns"),
        _col(batch, "collected"),
        _col(batch, "uncollectable"),
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
                    collected=_nz(col),
                    uncollectable=_nz(unc),
                )
            )
        )
    return out


def off_cpu(batch, runs):
    out = []
    for pid, tid, s, e, pre, cpu, res, off_ns, n, n_pre in zip(
        _col(batch, "pid"),
        _col(batch, "tid"),
        _col(batch, "start_ns"),
        _col(batch, "end_ns"),
        _col(batch, "preempted"),
        _col(batch, "cpu"),
        _col(batch, "resolution_ns"),
        _col(batch, "offcpu_ns"),
        _col(batch, "events"),
        _col(batch, "preempted_events"),
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


def run_queue(batch, runs):
    out = []
    for pid, tid, s, e, cpu, res, wait_ns, n in zip(
        _col(batch, "pid"),
        _col(batch, "tid"),
        _col(batch, "start_ns"),
        _col(batch, "end_ns"),
        _col(batch, "cpu"),
        _col(batch, "resolution_ns"),
        _col(batch, "wait_ns"),
        _col(batch, "events"),
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


def migrations(batch, runs):
    out = []
    for pid, tid, ts, a, b, res, n in zip(
        _col(batch, "pid"),
        _col(batch, "tid"),
        _col(batch, "ts_ns"),
        _col(batch, "from_cpu"),
        _col(batch, "to_cpu"),
        _col(batch, "resolution_ns"),
        _col(batch, "events"),
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


def gpu_samples(batch, runs):
    out = []
    for gpu, ts, sm, mem, power, temp, util, reasons, source in zip(
        _col(batch, "gpu"),
        _col(batch, "ts_ns"),
        _col(batch, "sm_clock_mhz"),
        _col(batch, "mem_clock_mhz"),
        _col(batch, "power_mw"),
        _col(batch, "temp_c"),
        _col(batch, "util_pct"),
        _col(batch, "clock_event_reasons"),
        _col(batch, "source"),
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


def stall_alerts(batch, runs):
    return [pb.Event(stall_alert=pb.StallAlert(**row)) for row in batch.to_pylist()]


CONVERTERS = {
    pb.SPAN: spans,
    pb.GC_PASS: gc_passes,
    pb.OFF_CPU: off_cpu,
    pb.RUN_QUEUE: run_queue,
    pb.MIGRATION: migrations,
    pb.GPU_SAMPLE: gpu_samples,
    pb.STALL_ALERT: stall_alerts,
}


def to_events(kind, batch, runs):
    return CONVERTERS[kind](batch, runs)
