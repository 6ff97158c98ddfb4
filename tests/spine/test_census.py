"""Heap census: the client's type histogram at connect and close, through a real daemon.

An engine that grows one known type between the two censuses must have that
type named as the top grower in `heap_growth` with its exact count; the
census itself leaves no tracked object behind (gc.get_objects() and
gc.get_count() read around it); a type that leaves the heap still shows,
with its exact shrinkage; a bad CENSUS datagram is rejected and counted
while the run goes on.
"""

import gc
import json

import duckdb
import pytest

import probe_client
from helpers.waiting import wait_for
from probe_client import _census, wire
from stallscope.analysis import report

pytestmark = pytest.mark.daemon


class CensusGrower:
    """The type the test engine grows (nothing else makes one)."""

    __slots__ = ("n", "__weakref__")

    def __init__(self, n):
        self.n = n


class CensusShrinker:
    def __init__(self, n):
        self.n = n


def test_census_names_the_grower_with_its_exact_count(daemon):
    shrinking = [CensusShrinker(i) for i in range(40_000)]  # ranked at start, gone at close
    probe = probe_client.connect(socket_path=daemon.socket, run_label="census", census=True)
    grown = [CensusGrower(i) for i in range(23_456)]
    del shrinking
    probe.close()
    assert daemon.stop()[0] == 0
    rows = daemon.query(
        "SELECT module, type_name, count_start, count_end, growth FROM heap_growth "
        "ORDER BY growth DESC"
    )
    assert rows[0] == (__name__, "CensusGrower", 0, 23_456, 23_456), rows[:3]
    by_name = {r[1]: r for r in rows}
    assert by_name["CensusShrinker"][2:] == (40_000, 0, -40_000)
    phases = daemon.query(
        "SELECT phase, tracked > 0, duration_ns > 0, top_n FROM heap_census_runs ORDER BY taken_ns"
    )
    assert phases == [("start", True, True, 30), ("close", True, True, 30)]
    assert daemon.scalar("SELECT census FROM runs") is True
    assert len(grown) == 23_456
    con = duckdb.connect(str(daemon.db), read_only=True)
    try:
        text = report.build_report(con)
    finally:
        con.close()
    growth = text.split("== Heap growth", 1)[1].split("==\n", 1)[1].split("\n== ", 1)[0]
    first = growth.splitlines()[2]  # header, rule, then the top grower
    assert f"{__name__}.CensusGrower" in first and "+23,456" in first, growth
    print(text)


def test_census_leaves_no_tracked_object_behind():
    # imports and caches warmed, the close path's too (run alone, the test's
    # first close census counted 738 allocations its first call makes)
    _, warm = _census.take_census("start")
    _census.take_census("close", baseline=warm)
    gc.disable()
    try:
        readings = [0] * 6
        readings[0] = len(gc.get_objects())
        readings[1] = gc.get_count()[0]
        payload, histogram = _census.take_census("start")
        readings[2] = len(gc.get_objects())
        readings[3] = gc.get_count()[0]
        _census.take_census("close", baseline=histogram)
        readings[4] = len(gc.get_objects())
        readings[5] = gc.get_count()[0]
    finally:
        gc.enable()
    assert readings[2] == readings[0] and readings[4] == readings[0], readings
    assert not gc.is_tracked(payload) and not gc.is_tracked(histogram)
    # gc.get_count()[0] moves by a few (2 alone, up to 8 inside the whole
    # suite's process): CPython's free lists do not count a list or tuple
    # they recycle. A census makes thousands of tracked objects while it
    # runs; what is left of them in the count is this noise, not objects.
    assert abs(readings[3] - readings[1]) <= 16 and abs(readings[5] - readings[3]) <= 16, readings


def test_warm_mark_moves_the_baseline_and_a_bad_census_is_rejected(daemon):
    probe = probe_client.connect(socket_path=daemon.socket, run_label="warm", census=True)
    before_warm = [CensusGrower(i) for i in range(5_000)]
    probe.mark("warm")
    after_warm = [CensusGrower(i) for i in range(7_000)]
    # A bad census on the same connection: rejected, the run goes on.
    bad = json.dumps({"phase": "close", "taken_ns": 1, "types": [["m", "t", -5]]}).encode()
    with probe._lock:
        probe._queue_control(wire.DGRAM_CENSUS, bad, 1)
    probe.close()
    assert daemon.stop()[0] == 0
    row = daemon.query(
        "SELECT from_phase, count_start, count_end, growth FROM heap_growth "
        "WHERE type_name = 'CensusGrower'"
    )
    assert row == [("warm", 5_000, 12_000, 7_000)]
    assert daemon.scalar("SELECT sum(count) FROM ingest_errors WHERE reason = 'bad_census'") == 1
    assert daemon.scalar("SELECT count(*) FROM run_events WHERE kind = 'mark'") == 1
    assert len(before_warm) + len(after_warm) == 12_000


def test_census_datagram_fits_one_datagram_with_long_names():
    made = [type("T" + "x" * 300 + str(i), (), {}) for i in range(200)]
    objs = [t() for t in made for _ in range(3)]
    payload, _ = _census.take_census("start", top_n=400)
    assert len(payload) <= wire.HELLO_MAX
    info = json.loads(payload)
    assert sum(r[2] for r in info["types"]) + info["other"] == info["tracked"]
    assert len(objs) == 600


def test_census_after_seconds_takes_the_start_census_late(daemon):
    probe = probe_client.connect(
        socket_path=daemon.socket, run_label="late", census=True, census_after_s=0.05
    )
    assert wait_for(lambda: probe._census == "taken")  # the timer's warm census
    # many, so that it ranks in the top 30 even in a large test process
    grown = [CensusGrower(i) for i in range(54_321)]
    probe.close()
    assert daemon.stop()[0] == 0
    assert daemon.query("SELECT phase FROM heap_census_runs ORDER BY taken_ns") == [
        ("warm",),
        ("close",),
    ]
    row = daemon.query("SELECT growth FROM heap_growth WHERE type_name = 'CensusGrower'")
    assert row == [(54_321,)] and len(grown) == 54_321
