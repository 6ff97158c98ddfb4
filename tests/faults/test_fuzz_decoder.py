"""Bad input, in process: the wire decoder against malformed datagrams.

A seeded mutator (fuzzwire.Fuzzer) makes datagrams of every malformed kind
the protocol names, with an exact model of the outcome; they go through
`Ingest._datagram()` on fake connections (no socket, so a million run in
about a minute), `decode_pending()` and a real DuckDB store. Then the
daemon's rejection counters, its `ingest_errors` rows and every run's stored
records and losses must equal the model. Hypothesis adds arbitrary bytes and
arbitrary hello JSON: nothing may raise, nothing may fail a database write.
"""

import json
import os
import sys
import time
from collections import Counter

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.fuzzwire import Fuzzer
from probe_client import wire
from stallscope.ingest.listener import Connection, Ingest
from stallscope.store.database import Store

pytestmark = pytest.mark.faults


class FakeSock:
    """What Ingest._close needs of a socket."""

    _next_fd = 100000

    def __init__(self):
        FakeSock._next_fd += 1
        self.fd = FakeSock._next_fd

    def fileno(self):
        return self.fd

    def close(self):
        pass


def _ingest(tmp_path, name="fuzz"):
    store = Store(str(tmp_path / f"{name}.duckdb"))
    ing = Ingest(store, socket_path=str(tmp_path / f"{name}.sock"))
    return store, ing


def _drive(
    ing, store, fz, n_datagrams, pids=(4001, 4002, 4003), decode_every=2000, session_max=300
):
    """Feed sessions until n_datagrams were made; returns seconds spent in ingest."""
    spent = 0.0
    since_decode = 0
    while fz.datagrams < n_datagrams:
        pid = fz.rng.choice(pids)
        dgrams, run, _ = fz.session(pid, session_max)
        conn = Connection(FakeSock(), pid, 0, 0)
        ing.conns[conn.sock.fileno()] = conn
        t0 = time.perf_counter()
        for d in dgrams:
            ing._datagram(conn, d)
        ing._close(conn)
        spent += time.perf_counter() - t0
        since_decode += len(dgrams)
        if since_decode >= decode_every:
            ing.decode_pending()
            fz.decode()
            since_decode = 0
            if fz.rng.random() < 0.2:
                store.flush()
    ing.decode_pending()
    fz.decode()
    store.flush()
    return spent


def test_decoder_counts_every_rejection_and_stores_exactly_the_model(tmp_path, full, figures):
    n = 1_000_000 if full else 40_000
    seed = int(os.environ.get("STALLSCOPE_FUZZ_SEED", "8"))
    fz = Fuzzer(seed)
    store, ing = _ingest(tmp_path)
    t0 = time.monotonic()
    # Longer sessions at full size: fewer runs, so the database bookkeeping
    # (a few ms per run) does not dominate a million datagrams.
    spent = _drive(ing, store, fz, n, session_max=2000 if full else 300)
    wall = time.monotonic() - t0
    assert ing.rejections.get("internal_error", 0) == 0
    assert dict(ing.rejections) == dict(fz.expected)
    assert store.rows_lost == 0 and store.rows_retained == 0, store.last_error
    store.close()
    con = duckdb.connect(str(tmp_path / "fuzz.duckdb"), read_only=True)
    try:
        errors = dict(
            con.execute(
                "SELECT reason, sum(count)::BIGINT FROM ingest_errors GROUP BY ALL"
            ).fetchall()
        )
        assert errors == dict(fz.expected)
        stored = dict(
            con.execute(
                "SELECT run_id, count(*) FROM (SELECT run_id FROM spans UNION ALL "
                "SELECT run_id FROM gc_events) GROUP BY ALL"
            ).fetchall()
        )
        lost = dict(
            con.execute("SELECT run_id, sum(count)::BIGINT FROM losses GROUP BY ALL").fetchall()
        )
        runs = dict(con.execute("SELECT run_id, connections FROM runs").fetchall())
        # Sequence numbers within a run never repeat.
        assert (
            con.execute(
                "SELECT count(*) FROM (SELECT run_id, seq FROM spans UNION ALL "
                "SELECT run_id, seq FROM gc_events) GROUP BY run_id, seq "
                "HAVING count(*) > 1"
            ).fetchall()
            == []
        )
    finally:
        con.close()
    assert runs == {r.run_id: r.connections for r in fz.runs}
    for r in fz.runs:
        assert stored.get(r.run_id, 0) == r.stored, r.run_id
        assert lost.get(r.run_id, 0) == r.lost, r.run_id
        assert r.stored + r.lost + _rejected_seq(r) <= r.expected
    figures.update(
        datagrams=fz.datagrams,
        rejected=sum(fz.expected.values()),
        by_reason=dict(sorted(fz.expected.items())),
        runs=len(fz.runs),
        resumed_connections=sum(r.connections - 1 for r in fz.runs),
        **{f"records_{k}": v for k, v in fz.totals().items()},
        ingest_s=round(spent, 1),
        wall_s=round(wall, 1),
        datagrams_per_s=int(fz.datagrams / spent),
        seed=seed,
    )


def _rejected_seq(run):
    return 0  # records of rejected kinds inside accepted datagrams still take numbers


# ----- hypothesis: arbitrary bytes and arbitrary hello JSON --------------------------
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)
_hello_info = st.dictionaries(
    st.sampled_from(
        [
            "run_token",
            "pid",
            "tid",
            "label",
            "argv",
            "python",
            "gc_threshold",
            "gc_count",
            "freeze_count",
            "gc_enabled",
            "realtime_ns",
            "monotonic_ns",
            "free_threaded",
            "implementation",
        ]
    ),
    _json,
    max_size=8,
)
_header = st.builds(
    lambda magic, version, kind, count, rsize, seq, sent, df, dd: wire.HEADER.pack(
        magic, version, kind, count, rsize, seq, sent, df, dd
    ),
    st.sampled_from([wire.MAGIC, wire.MAGIC, 0]),
    st.sampled_from([1, 1, 1, 0, 2]),
    st.integers(0, 255),
    st.integers(0, 0xFFFF),
    st.sampled_from([32, 32, 0, 33]),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
)
_datagram = st.one_of(
    st.binary(max_size=200),
    st.tuples(_header, st.binary(max_size=600)).map(lambda t: t[0] + t[1]),
    st.builds(
        lambda info, seq: (
            wire.HEADER.pack(wire.MAGIC, 1, wire.DGRAM_HELLO, 0, 32, seq, 1, 0, 0)
            + json.dumps(info).encode()
        ),
        _hello_info,
        st.integers(0, 2**64 - 1),
    ),
    st.builds(
        lambda c, seq, recs: (
            wire.HEADER.pack(wire.MAGIC, 1, wire.DGRAM_RECORDS, c, 32, seq, 1, 0, 0)
            + b"".join(recs)
        ),
        st.integers(0, 8),
        st.integers(0, 2**64 - 1),
        st.lists(st.binary(min_size=32, max_size=32), max_size=8),
    ),
)


_FULL = os.environ.get("STALLSCOPE_FULL_FAULTS") == "1" or "--full" in sys.argv
_shared = {}


def _shared_store(tmp_path_factory):
    """One database for every example (a new one costs ~200 ms of schema)."""
    if "store" not in _shared:
        tmp = tmp_path_factory.mktemp("hyp")
        _shared["dir"] = tmp
        _shared["store"] = Store(str(tmp / "hyp.duckdb"))
        _shared["n"] = 0
    _shared["n"] += 1
    return _shared["store"], _shared["dir"] / f"{_shared['n']}.sock"


def _db_rejections(store):
    cur = store.cursor()
    try:
        return Counter(
            dict(
                cur.execute(
                    "SELECT reason, sum(count)::BIGINT FROM ingest_errors GROUP BY ALL"
                ).fetchall()
            )
        )
    finally:
        cur.close()


@settings(
    max_examples=1000 if _FULL else 150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(_datagram, min_size=1, max_size=30))
def test_arbitrary_datagrams_never_raise_and_never_fail_a_write(tmp_path_factory, dgrams):
    store, sock_path = _shared_store(tmp_path_factory)
    before = _db_rejections(store)
    lost_before = store.rows_lost
    ing = Ingest(store, socket_path=str(sock_path))
    try:
        conn = Connection(FakeSock(), 4242, 0, 0)
        hello = wire.HEADER.pack(wire.MAGIC, 1, wire.DGRAM_HELLO, 0, 32, 0, 1, 0, 0) + b"{}"
        other = Connection(FakeSock(), 4243, 0, 0)
        for d in dgrams:
            ing._datagram(conn, d)  # raises = test failure
            ing._datagram(other, hello if other.run is None else d)
        ing.decode_pending()
        store.flush()
    finally:
        ing.listener.close()
    assert ing.rejections.get("internal_error", 0) == 0
    assert store.rows_lost == lost_before and store.rows_retained == 0, store.last_error
    # Every datagram is accepted or rejected, and the database holds the counts.
    assert ing.datagrams == 2 * len(dgrams)
    assert _db_rejections(store) - before == ing.rejections
