"""The live stall detector on constructed batches (no daemon needed)."""

import numpy as np
import pyarrow as pa

from stallscope.api.v1 import stallscope_pb2 as pb
from stallscope.store.alerts import Baselines, StallDetector, alert_parts
from stallscope.store.fanout import Fanout, Filter

MS = 1_000_000


def spans(rows):
    cols = ("run_id", "tid", "kind", "stage", "batch", "start_ns", "end_ns")
    return pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)})


def steady(n, run=1, tid=10, stage="recurrent", batch=4, dur=10 * MS, t0=0):
    return [
        (run, tid, "step", stage, batch, t0 + i * 20 * MS, t0 + i * 20 * MS + dur) for i in range(n)
    ]


def detector(hold_s=0.0):
    fan = Fanout(lambda: {1: 4242, 2: 4343})
    return fan, StallDetector(fan, factor=1.2, window=16, min_samples=8, hold_unexplained_s=hold_s)


def test_running_median_per_key():
    b = Baselines(window=4)
    assert b.observe("k", 10) == (None, 0)
    for v in (20, 30, 40):
        b.observe("k", v)
    assert b.observe("k", 100) == (30, 4)  # median of 10..40 (upper middle)
    assert b.observe("k", 1) == (40, 4)  # 10 fell out of the window
    assert b.observe("other", 5) == (None, 0)


def test_no_alert_until_enough_history_and_only_above_factor():
    fan, det = detector()
    # the 5th step is 3x slower but there are fewer than 8 before it
    rows = steady(4) + [(1, 10, "step", "recurrent", 4, 200 * MS, 230 * MS)]
    assert det.process([(pb.SPAN, spans(rows))]) is None
    rows = steady(10, t0=1000 * MS)
    rows.append((1, 10, "step", "recurrent", 4, 2000 * MS, 2000 * MS + 11 * MS))  # 1.1x
    rows.append((1, 10, "step", "recurrent", 4, 3000 * MS, 3000 * MS + 13 * MS))  # 1.3x
    rows.append((1, 10, "submit", "recurrent", 4, 4000 * MS, 4000 * MS + 90 * MS))  # not a step
    got = det.process([(pb.SPAN, spans(rows))])
    assert got is not None and got.num_rows == 1
    a = got.to_pylist()[0]
    assert a["duration_ns"] == 13 * MS and a["baseline_ns"] == 10 * MS and a["pid"] == 4242
    assert a["cause"] == "unexplained" and a["gc_generation"] == -1


def test_baselines_are_per_run_stage_and_batch():
    fan, det = detector()
    rows = steady(10, batch=4, dur=10 * MS) + steady(10, batch=32, dur=40 * MS, t0=5000 * MS)
    assert det.process([(pb.SPAN, spans(rows))]) is None  # 40 ms is normal for batch 32


def test_alert_says_gc_and_off_cpu_inside_the_step():
    fan, det = detector()
    sub = fan.subscribe(Filter(kinds=[pb.STALL_ALERT]))
    base = steady(10)
    s, e = 1000 * MS, 1000 * MS + 60 * MS
    gcs = pa.table(
        {
            "run_id": [1, 1, 2],
            "tid": [10, 10, 10],
            "generation": [2, 0, 2],
            "start_ns": [s + 5 * MS, s - 5 * MS, s],
            "end_ns": [s + 45 * MS, s + 1 * MS, e],
            "collected": [5, 1, 1],
            "uncollectable": [0, 0, 0],
        }
    )
    off = pa.table(
        {
            "pid": [4242, 4242],
            "tid": [10, 11],
            "start_ns": [s + 50 * MS, s],
            "end_ns": [s + 55 * MS, e],
            "preempted": [True, False],
            "cpu": [0, 1],
        }
    )
    det.process(
        [
            (pb.SPAN, spans(base)),
            (pb.GC_PASS, gcs),
            (pb.OFF_CPU, off),
            (pb.SPAN, spans([(1, 10, "step", "recurrent", 4, s, e)])),
        ]
    )
    items, dropped = sub.take(1)
    assert dropped == 0 and len(items) == 1
    kind, table = items[0]
    assert kind == pb.STALL_ALERT
    a = table.to_pylist()[0]
    # run 2's GC and thread 11's off-CPU time are not this step's
    assert a["gc_overlap_ns"] == 40 * MS + 1 * MS and a["gc_generation"] == 2
    assert a["offcpu_ns"] == 5 * MS and a["preempted_ns"] == 5 * MS
    # one vocabulary with step_attribution: 'gc' (the generation has its own field)
    assert a["cause"] == "gc" and abs(a["ratio"] - 6.0) < 1e-9
    assert a["offcpu_sampled"] is False


def test_cause_names_the_largest_disjoint_part():
    def parts(gc, off, pre=True, yielded=False):
        gc_a, gc_b = (np.array([g[0] for g in gc]), np.array([g[1] for g in gc]))
        off_a, off_b = (np.array([o[0] for o in off]), np.array([o[1] for o in off]))
        w = np.array([[1.0, 1.0 if pre else 0.0, 0.0, 1.0 if yielded else 0.0]] * len(off))
        return alert_parts(gc_a, gc_b, off_a, off_b, w)

    # a 6 ms wait, 5 ms of it under a GC pass on another thread: GC's time
    p = parts([(10, 15)], [(9, 15)], pre=False)
    assert p == {"gc": 5.0, "runqueue": 0.0, "preemption": 0.0, "blocked": 1.0}
    from stallscope.vocab.rules import name_cause

    assert name_cause(8, p) == "gc"
    assert name_cause(10, parts([], [(0, 6)])) == "preemption"
    # the thread gave its CPU away in sched_yield(): waiting for a CPU, as in
    # step_attribution, not preempted
    p = parts([], [(0, 6)], yielded=True)
    assert p == {"gc": 0.0, "runqueue": 6.0, "preemption": 0.0, "blocked": 0.0}
    assert name_cause(10, p) == "runqueue"
    assert name_cause(10, parts([], [(0, 6)], pre=False)) == "blocked"
    assert name_cause(10, parts([], [(0, 4)], pre=False)) == "unexplained"  # under half


def test_a_yield_is_weighed_apart_from_a_preemption():
    from stallscope.vocab.offcpu import offcpu_weights

    base = {"start_ns": [0, 0, 0, 0], "end_ns": [5, 5, 5, 5]}
    pre = pa.array([True, True, False, None], pa.bool_())
    w = offcpu_weights(
        pa.table({**base, "preempted": pre, "yielded": pa.array([True, False, None, True])})
    )
    assert w[:, 1].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert w[:, 3].tolist() == [1.0, 0.0, 0.0, 0.0]  # only a preempted row can be a yield
    # a backend that cannot tell (no column): no yields
    assert offcpu_weights(pa.table({**base, "preempted": pre}))[:, 3].tolist() == [0.0] * 4


def test_idle_steps_are_never_slow_nor_in_the_baseline():
    fan, det = detector()
    rows = steady(10)
    # batch 0 on a thread that reports batch sizes: idle, 10 x the baseline
    rows.append((1, 10, "step", "recurrent", 0, 1000 * MS, 1100 * MS))
    assert det.process([(pb.SPAN, spans(rows))]) is None and det.idle_steps == 1
    # a thread that never reports a batch size: batch 0 means unknown, not idle
    other = steady(10, tid=11, batch=0) + [(1, 11, "step", "recurrent", 0, 5000 * MS, 5030 * MS)]
    got = det.process([(pb.SPAN, spans(other))])
    assert got is not None and got.num_rows == 1 and det.idle_steps == 1


def test_fanout_drops_only_what_the_subscriber_wanted_and_never_blocks():
    fan = Fanout(lambda: {1: 100, 2: 200})
    sub = fan.subscribe(Filter(kinds=[pb.SPAN], run_ids=[1]), max_queue_events=10)
    other = fan.subscribe(Filter(kinds=[pb.GC_PASS]))
    batch = spans(steady(8, run=1) + steady(8, run=2))
    fan.on_batch("spans", batch)  # 16 rows: over the bound of 10 -> dropped
    fan.on_batch("spans", spans(steady(5, run=1)))  # fits
    fan.on_batch("unknown_table", batch)  # not streamed
    items, dropped = sub.take(0)
    assert dropped == 8  # run 1's rows only
    assert [t.num_rows for _, t in items] == [5]
    assert other.take(0) == ([], 0)
    assert fan.dropped_total() == 8


def test_sampled_proc_windows_are_pro_rated_and_flagged():
    """A /proc window row is a total over the window, not one interval."""
    fan, det = detector()
    s, e = 1000 * MS, 1000 * MS + 40 * MS
    # a 100 ms window (covering the whole step) in which the thread was off CPU
    # 50 ms, 3 of 4 switch-outs involuntary: the step's 40 ms get 20 ms off CPU,
    # 15 ms of it preempted
    off = pa.table(
        {
            "pid": pa.array([4242], pa.int32()),
            "tid": pa.array([10], pa.int32()),
            "start_ns": [s - 30 * MS],
            "end_ns": [s + 70 * MS],
            "preempted": pa.array([None], pa.bool_()),
            "cpu": pa.array([None], pa.int16()),
            "resolution_ns": [100 * MS],
            "events": pa.array([4], pa.int32()),
            "preempted_events": pa.array([3], pa.int32()),
            "offcpu_ns": [50 * MS],
        }
    )
    got = det.process(
        [
            (pb.SPAN, spans(steady(10))),
            (pb.OFF_CPU, off),
            (pb.SPAN, spans([(1, 10, "step", "recurrent", 4, s, e)])),
        ]
    )
    a = got.to_pylist()[0]
    assert a["offcpu_ns"] == 20 * MS and a["preempted_ns"] == 15 * MS
    assert a["offcpu_sampled"] is True and a["cause"] == "preemption"  # exactly half the excess


def test_unexplained_alert_waits_for_late_kernel_events():
    import time as _time

    fan, det = detector(hold_s=0.2)
    slow = (1, 10, "step", "recurrent", 4, 1000 * MS, 1000 * MS + 40 * MS)
    assert det.process([(pb.SPAN, spans(steady(10) + [slow]))]) is None  # held
    assert len(det.pending) == 1
    off = pa.table(
        {
            "pid": [4242],
            "tid": [10],
            "start_ns": [1005 * MS],
            "end_ns": [1035 * MS],
            "preempted": [False],
            "cpu": [0],
        }
    )
    got = det.process([(pb.OFF_CPU, off)])  # the interval arrives a round later
    a = got.to_pylist()[0]
    assert a["cause"] == "blocked" and a["offcpu_ns"] == 30 * MS and not det.pending
    other = (1, 10, "step", "recurrent", 4, 2000 * MS, 2000 * MS + 40 * MS)
    assert det.process([(pb.SPAN, spans([other]))]) is None
    _time.sleep(0.25)
    got = det.process([])  # nothing came: sent as unexplained
    assert got.to_pylist()[0]["cause"] == "unexplained" and not det.pending


def test_sub_microsecond_steps_are_not_alerted_below_the_minimum_excess():
    """200k steps of ~650 ns with noise used to give tens of thousands of
    alerts; an excess under MIN_EXCESS_NS is never alerted, a real stall is."""
    from stallscope.store.alerts import MIN_EXCESS_NS

    fan, det = detector()
    rng = np.random.default_rng(1)
    durs = rng.choice([600, 650, 800, 1500, 9000], size=20_000, p=[0.4, 0.3, 0.2, 0.08, 0.02])
    rows = [(1, 10, "step", "decode", 1, i * 2000, i * 2000 + int(d)) for i, d in enumerate(durs)]
    assert det.process([(pb.SPAN, spans(rows))]) is None
    assert det.small_excess > 1000  # the 1.2x rule alone would have fired this often
    t = 20_000 * 2000
    rows = [(1, 10, "step", "decode", 1, t, t + 650 + MIN_EXCESS_NS + 1)]
    got = det.process([(pb.SPAN, spans(rows))])
    assert got is not None and got.num_rows == 1
