"""A batch without a column its kind must have is never streamed as zeros
silently: `to_events` raises, or (in the daemon's stream) reports it; the
columns that may be absent by design are listed, and every column a
converter reads exists in its table."""

import pyarrow as pa
import pytest

from helpers.schema_db import fresh_db
from stallscope.api import events
from stallscope.api.v1 import stallscope_pb2 as pb
from stallscope.vocab.event_kinds import TABLE_KINDS


def columns_read(kind):
    """The columns the converter of `kind` reads, in order (from an empty batch
    that lacks them all, in reporting mode)."""
    empty = pa.table({"_": pa.array([], pa.int64())})
    col = events._Columns(kind, empty, lambda _kind, _cols: None)
    events.CONVERTERS[kind](col, {})
    return col.missing + [c for c in events.OPTIONAL[kind] if c not in col.missing]


def table_columns(table, con):
    return [
        r[0]
        for r in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
            "ORDER BY ordinal_position",
            [table],
        ).fetchall()
    ]


@pytest.mark.parametrize("table", sorted(TABLE_KINDS), ids=str)
def test_every_column_a_converter_reads_is_in_its_table(table):
    kind = TABLE_KINDS[table]
    con = fresh_db()
    have = set(table_columns(table, con))
    if table == "stall_alerts":  # not a table: the detector's own batches
        have = {f.name for f in pb.StallAlert.DESCRIPTOR.fields}
    if table == "hang_events":  # not a table: the hang watchdog's own batches
        have = set(_hang_event("hung").column_names)
    if table == "request_finished":  # not a table: the request feed's own batches
        have = set(_request_finished().column_names)
    read = columns_read(kind)
    assert read, table
    assert set(read) - have == set(), f"{table}: the converter reads columns the schema lacks"
    assert events.OPTIONAL[kind] <= set(read), "an optional column nobody reads"


def _hang_event(state):
    """The batch the hang watchdog hands the fanout for an episode's news."""
    from stallscope.service.hang import HangWatchdog

    got = []

    class Fanout:
        def on_batch(self, table, batch):
            got.append((table, batch))

    info = {"run_id": 3, "pid": 4242, "detected_ns": 9_000, "threshold_ns": 1_000,
            "last_step_end_ns": 7_000, "recovered_ns": 12_000 if state != "hung" else None,
            "reason": "no step end for 2.0 s", "dump_id": 77}  # fmt: skip
    if state == "hung":
        info.update(threads=3, lacks=None)
    HangWatchdog.to_fanout(Fanout())(state, info)
    ((table, batch),) = got
    assert table == "hang_events"
    return batch


def test_hang_events_stream_as_hung_messages():
    (ev,) = events.to_events(pb.HUNG, _hang_event("hung"), {})
    assert ev.WhichOneof("payload") == "hung"
    h = ev.hung
    assert (h.state, h.run_id, h.pid, h.dump_id, h.threads) == ("hung", 3, 4242, 77, 3)
    assert h.recovered_ns == 0 and h.lacks == "" and h.reason.startswith("no step end")
    (ev,) = events.to_events(pb.HUNG, _hang_event("recovered"), {})
    assert ev.hung.state == "recovered" and ev.hung.recovered_ns == 12_000


def _spans(drop=()):
    cols = {
        "run_id": [1],
        "tid": [7],
        "kind": ["step"],
        "stage": ["decode"],
        "batch": [4],
        "start_ns": [100],
        "end_ns": [350],
        "depth": [0],
        "seq": [3],
    }
    return pa.table({k: v for k, v in cols.items() if k not in drop})


def test_a_missing_required_column_raises():
    (ev,) = events.to_events(pb.SPAN, _spans(), {1: 4242})
    assert ev.span.duration_ns == 250 and ev.span.pid == 4242
    with pytest.raises(events.MissingColumns, match="SPAN batch lacks column.*end_ns"):
        events.to_events(pb.SPAN, _spans(drop=("end_ns",)), {})


def test_the_stream_reports_it_and_goes_on_with_unknowns():
    reported = []
    (ev,) = events.to_events(
        pb.SPAN, _spans(drop=("stage", "seq")), {}, on_missing=lambda k, c: reported.append((k, c))
    )
    assert reported == [(pb.SPAN, ("stage", "seq"))]
    assert ev.span.stage == "" and ev.span.seq == 0 and ev.span.end_ns == 350


def test_optional_columns_may_be_absent():
    exact_offcpu = pa.table(
        {
            "pid": [1],
            "tid": [2],
            "start_ns": [10],
            "end_ns": [20],
            "preempted": [True],
            "cpu": [0],
        }
    )
    (ev,) = events.to_events(pb.OFF_CPU, exact_offcpu, {})
    assert ev.off_cpu.preempted and ev.off_cpu.duration_ns == 10
    usdt_gc = pa.table(
        {
            "run_id": [1],
            "tid": [2],
            "generation": [2],
            "start_ns": [5],
            "end_ns": [9],
            "collected": [3],
        }
    )
    (ev,) = events.to_events(pb.GC_PASS, usdt_gc, {})
    assert ev.gc_pass.generation == 2


def _request_finished():
    """The batch the request feed hands the fanout when requests end: request
    5 arrives at 1 ms, tokens at 3, 4 and 9 ms (2 each), finishes at 10 ms;
    request 6's arrival was never seen, it is aborted."""
    from stallscope.store.request_ends import RequestFinishedFeed

    got = []

    class Fanout:
        def on_batch(self, table, batch):
            got.append((table, batch))

    feed = RequestFinishedFeed(Fanout())
    ms = 1_000_000
    rows = [(5, "arrived", 1), (5, "token", 3), (6, "token", 2), (5, "token", 4),
            (5, "token", 9), (5, "finished", 10), (6, "aborted", 11)]  # fmt: skip
    feed.on_batch("requests", pa.table({"run_id": [3], "request_id": pa.array([5], pa.uint64()),
                                        "text": ["req-5"]}))  # fmt: skip
    feed.on_batch(
        "request_events",
        pa.table(
            {
                "run_id": [3] * len(rows),
                "request_id": pa.array([r[0] for r in rows], pa.uint64()),
                "event": [r[1] for r in rows],
                "ts_ns": [r[2] * ms for r in rows],
                "tid": [1] * len(rows),
                "tokens": pa.array([2 if r[1] == "token" else None for r in rows], pa.int64()),
                "seq": list(range(len(rows))),
            }
        ),
    )
    ((table, batch),) = got
    assert table == "request_finished"
    return batch


def test_request_ends_stream_as_request_finished_messages():
    a, b = events.to_events(pb.REQUEST_FINISHED, _request_finished(), {3: 4242})
    r = a.request_finished
    assert (r.run_id, r.pid, r.request_id, r.text, r.end_event) == (3, 4242, 5, "req-5", "finished")
    ms = 1_000_000
    assert (r.arrival_ns, r.end_ns, r.ttft_ns, r.e2e_ns) == (1 * ms, 10 * ms, 2 * ms, 9 * ms)
    assert (r.output_tokens, r.itl_max_ns) == (6, 5 * ms)
    r = b.request_finished
    assert (r.request_id, r.text, r.end_event, r.output_tokens) == (6, "", "aborted", 2)
    assert (r.arrival_ns, r.ttft_ns, r.e2e_ns, r.itl_max_ns) == (0, -1, -1, -1)
