"""Query through the daemon: read-only, sandboxed, bounded; and the CLI/access path."""

import json
import os
import subprocess
import sys

import grpc
import pytest

import probe_client
from helpers.api import start_api_daemon, stop
from helpers.waiting import wait_for
from stallscope.analysis import access
from stallscope.api.client import ApiError, ApiSource, Client
from stallscope.api.v1 import stallscope_pb2 as pb
from stallscope.api.v1 import stallscope_pb2_grpc as pb_grpc
from stallscope.cli.source import open_for_reading

pytestmark = pytest.mark.daemon

N_STEPS = 600


@pytest.fixture(scope="module")
def qd(tmp_path_factory):
    """One daemon holding N_STEPS steps, shared by this module's tests."""
    path = tmp_path_factory.mktemp("query")
    d = start_api_daemon(path)
    probe = probe_client.connect(socket_path=d.socket, run_label="q", gc=False)
    for i in range(N_STEPS):
        t0 = probe.begin()
        probe.end("step", t0, stage=("prefill", "recurrent", "coda")[i % 3], batch=i % 4)
    probe.close()
    c = Client(d.api_socket)
    c.wait_ready()
    assert wait_for(lambda: c.query("SELECT count(*) FROM spans")[1][0][0] == N_STEPS)
    d.client = c
    d.outside = path / "outside"
    d.outside.mkdir()
    yield d
    c.close()
    stop(d)


def _refused(client, sql, code=grpc.StatusCode.INVALID_ARGUMENT):
    with pytest.raises(ApiError) as info:
        client.query(sql)
    assert info.value.code == code, str(info.value)
    return str(info.value)


def test_select_returns_rows_and_params(qd):
    cols, rows = qd.client.query(
        "SELECT stage, count(*) AS n FROM spans WHERE batch >= ? GROUP BY stage ORDER BY stage",
        params=[2],
    )
    assert cols == ["stage", "n"]
    assert rows == [("coda", 100), ("prefill", 100), ("recurrent", 100)]
    # the same through protobuf rows (any gRPC client)
    msgs = list(
        qd.client.stub.Query(
            pb.QueryRequest(
                sql="SELECT seq, stage, batch, NULL AS nothing, [1, 2] AS l FROM spans "
                "ORDER BY seq LIMIT 3"
            )
        )
    )
    assert [c.name for c in msgs[0].columns] == ["seq", "stage", "batch", "nothing", "l"]
    assert msgs[0].columns[0].type == "BIGINT"
    rows = [r for m in msgs for r in m.rows]
    first = rows[0].values
    assert first[0].int_value == 0 and first[1].string_value == "prefill"
    assert first[3].is_null and first[4].string_value == "[1, 2]"
    assert msgs[-1].done and msgs[-1].total_rows == 3 and not msgs[-1].truncated


def test_row_limit_cuts_and_says_so(qd):
    table, _, truncated = qd.client.query_arrow("SELECT * FROM spans", limit=250)
    assert table.num_rows == 250 and truncated
    table, _, truncated = qd.client.query_arrow("SELECT * FROM spans", limit=N_STEPS)
    assert table.num_rows == N_STEPS and not truncated
    msgs = list(
        qd.client.stub.Query(
            pb.QueryRequest(sql="SELECT * FROM range(100000)", max_rows=50_000, batch_rows=1000)
        )
    )
    assert sum(len(m.rows) for m in msgs) == 50_000 and msgs[-1].truncated
    assert max(len(m.rows) for m in msgs) <= 1000


def test_time_limit_interrupts(qd):
    with pytest.raises(ApiError) as info:
        qd.client.query("SELECT count(*) FROM range(100000000000) a, range(1000) b", timeout_ms=300)
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "time limit" in str(info.value)
    # the daemon answers the next query as usual
    assert qd.client.query("SELECT 42")[1] == [(42,)]


ESCAPES = {
    "copy_to": "COPY spans TO '{out}/spans.csv'",
    "copy_select_to": "COPY (SELECT * FROM spans) TO '{out}/x.parquet' (FORMAT parquet)",
    "read_csv": "SELECT * FROM read_csv('/etc/passwd')",
    "read_text": "SELECT * FROM read_text('/etc/passwd')",
    "glob": "SELECT * FROM glob('/etc/*')",
    "attach": "ATTACH '{out}/other.duckdb' AS other",
    "install": "INSTALL httpfs",
    "load": "LOAD httpfs",
    "set": "SET enable_external_access = true",
    "set_memory": "SET memory_limit = '64GB'",
    "pragma": "PRAGMA threads = 1",
    "create": "CREATE TABLE evil AS SELECT 1",
    "create_view": "CREATE VIEW evil AS SELECT 1",
    "insert": "INSERT INTO spans (run_id) VALUES (99)",
    "delete": "DELETE FROM spans",
    "update": "UPDATE spans SET batch = 0",
    "drop": "DROP TABLE spans",
    "two_statements": "SELECT 1; DELETE FROM spans",
    "nextval": "SELECT nextval('run_id_seq')",
    "query_fn": "SELECT * FROM query('DELETE FROM spans')",
    "export": "EXPORT DATABASE '{out}/dump'",
    "checkpoint": "CHECKPOINT",
    "detach": "DETACH DATABASE test",
    # The database's own files stay readable to DuckDB without external
    # access: the plan check must refuse them, in any position.
    "read_blob_own_db": "SELECT * FROM read_blob('{db}')",
    "read_blob_own_wal": "SELECT size FROM read_blob('{db}.wal')",
    "read_text_own_db_subquery": "SELECT 1 WHERE 0 < (SELECT count(*) FROM read_text('{db}'))",
    "read_blob_in_cte": "WITH x AS (SELECT * FROM read_blob('{db}')) SELECT count(*) FROM x",
    "explain_analyze": "EXPLAIN ANALYZE SELECT * FROM read_blob('{db}')",
}
# Malformed requests rather than refusals: INVALID_ARGUMENT. Every other
# escape is the sandbox saying no: PERMISSION_DENIED.
NOT_REFUSALS = {"two_statements", "query_fn"}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_escape_refused(qd, name):
    sql = ESCAPES[name].format(out=qd.outside, db=qd.db)
    code = (
        grpc.StatusCode.INVALID_ARGUMENT
        if name in NOT_REFUSALS
        else grpc.StatusCode.PERMISSION_DENIED
    )
    message = _refused(qd.client, sql, code)
    assert message  # the database's (or the API's) reason, for the user
    assert os.listdir(qd.outside) == []
    _, rows = qd.client.query("SELECT count(*), sum(batch) FROM spans")
    assert rows == [(N_STEPS, sum(i % 4 for i in range(N_STEPS)))]
    tables = qd.client.query(
        "SELECT table_name FROM information_schema.tables WHERE table_name = 'evil'"
    )[1]
    assert tables == []


def test_plain_reads_and_explain_still_work(qd):
    """The file check refuses readers, not ordinary queries over tables and views."""
    assert qd.client.query("SELECT count(*) FROM range(5)")[1] == [(5,)]
    _, rows = qd.client.query("EXPLAIN SELECT count(*) FROM spans")
    assert rows
    _, rows = qd.client.query(
        "SELECT count(*) FROM spans s JOIN runs r USING (run_id) WHERE s.batch >= ?", [0]
    )
    assert rows == [(N_STEPS,)]
    # A recursive CTE reads itself, not a file (step_attribution's peer chain is one)
    _, rows = qd.client.query(
        "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 4) "
        "SELECT sum(n) FROM t"
    )
    assert rows == [(10,)]


def test_syntax_error_is_invalid_argument_with_database_message(qd):
    message = _refused(qd.client, "SELEC 1")
    assert "syntax error" in message.lower()
    message = _refused(qd.client, "SELECT no_such_column FROM spans")
    assert "no_such_column" in message


def test_access_uses_the_api_when_the_daemon_holds_the_file(qd):
    source = open_for_reading(qd.db, qd.api_socket)
    try:
        assert isinstance(source, ApiSource)
        cols, rows = source.query(access.named_or_sql("spans"), limit=5)
        assert len(rows) == 5 and "stage" in cols
        con = source.connection()
        cur = con.execute("SELECT stage, count(*) FROM spans GROUP BY 1 ORDER BY 1")
        assert [d[0] for d in cur.description] == ["stage", "count_star()"]
        assert cur.fetchall() == [("coda", 200), ("prefill", 200), ("recurrent", 200)]
        assert con.execute("SELECT ?::INTEGER + 1", [41]).fetchone() == (42,)
        with pytest.raises(access.AccessError) as info:
            source.query("DELETE FROM spans")
        assert "not allowed" in str(info.value)
    finally:
        source.close()


def test_stallscope_query_cli_goes_through_the_daemon(qd):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "stallscope.cli",
            "query",
            "--db",
            qd.db,
            "--api-socket",
            qd.api_socket,
            "--format",
            "csv",
            "SELECT stage, count(*) AS n FROM spans GROUP BY 1 ORDER BY 1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["stage,n", "coda,200", "prefill,200", "recurrent,200"]
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "stallscope.cli",
            "query",
            "--db",
            qd.db,
            "--api-socket",
            qd.api_socket,
            "COPY spans TO '/tmp/x.csv'",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "COPY" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_stallscope_status_cli_goes_through_the_daemon(qd):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "stallscope.cli",
            "status",
            "--db",
            qd.db,
            "--api-socket",
            qd.api_socket,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "## Runs" in out.stdout and "## Probes" in out.stdout
    assert "disabled by configuration" in out.stdout


def test_status_and_runs(qd):
    st = qd.client.status()
    assert st.db_path == qd.db and st.db_bytes > 0
    assert st.daemon_pid == qd.proc.pid
    assert st.records_received >= N_STEPS and st.rows_written >= N_STEPS
    off = ("sched", "gpu", "page_faults", "irq", "steal", "syscalls", "cpu", "cuda")  # all off
    # but the placement probe (/proc and /sys reads only: on by default everywhere)
    expect = dict.fromkeys(off, "unavailable") | {"placement": "active"}
    assert {p.probe: p.state for p in st.probes} == expect
    assert all(p.detail for p in st.probes)
    runs = qd.client.runs()
    assert [(r.label, r.pid, r.records, r.live) for r in runs] == [
        ("q", os.getpid(), N_STEPS, False)
    ]
    assert qd.client.runs(live_only=True) == []


@pytest.mark.parametrize("big", [2**64 + 1, -(2**63) - 1])
def test_integers_beyond_64_bits_cross_the_api_both_ways(qd, big):
    # A parameter beyond 64 bits goes as decimal text (it used to make the
    # client raise), a HUGEINT result comes back whole in either format.
    cols, rows = qd.client.query("SELECT ?::HUGEINT AS h", params=[big])
    assert rows == [(big,)]
    msgs = list(qd.client.stub.Query(pb.QueryRequest(sql=f"SELECT {big}::HUGEINT AS h")))
    (value,) = [v for m in msgs for r in m.rows for v in r.values]
    assert value.WhichOneof("kind") == "string_value" and int(value.string_value) == big


def test_results_are_cut_by_size_for_stock_clients(qd):
    """10 MB of text in 10,000 rows reaches a client with gRPC's default 4 MiB
    receive limit, in both formats, and no message is over the limit."""
    plain = grpc.insecure_channel("unix:" + qd.api_socket)  # default limits
    stub = pb_grpc.StallscopeStub(plain)
    sql = "SELECT range AS i, repeat('x', 1000) AS s FROM range(10000)"
    try:
        for fmt in (pb.ROWS, pb.ARROW_IPC):
            msgs = list(stub.Query(pb.QueryRequest(sql=sql, format=fmt), timeout=60))
            assert msgs[-1].done and msgs[-1].total_rows == 10_000
            assert max(m.ByteSize() for m in msgs) <= 4 << 20
            assert len(msgs) >= 4  # ~10 MB cannot fit in fewer 4 MiB messages
            if fmt == pb.ROWS:
                rows = [r for m in msgs for r in m.rows]
                assert [r.values[0].int_value for r in rows] == list(range(10_000))
                assert all(r.values[1].string_value == "x" * 1000 for r in rows)
            else:
                import pyarrow as pa

                n = sum(pa.ipc.open_stream(m.arrow_ipc).read_all().num_rows for m in msgs[:-1])
                assert n == 10_000
        # a smaller asked-for limit is kept too
        msgs = list(stub.Query(pb.QueryRequest(sql=sql, max_message_bytes=100_000), timeout=60))
        assert max(m.ByteSize() for m in msgs) <= 100_000
        assert sum(len(m.rows) for m in msgs) == 10_000
        # one row larger than the limit: a clear RESOURCE_EXHAUSTED, nothing half-sent
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Query(pb.QueryRequest(sql="SELECT repeat('y', 5000000) AS big"), timeout=60))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_message_bytes" in info.value.details()
    finally:
        plain.close()
    assert qd.client.query("SELECT 1")[1] == [(1,)]


def test_values_are_typed_text_not_python_reprs(qd):
    sql = (
        "SELECT INTERVAL 1 MONTH + INTERVAL 2 DAY + INTERVAL 3 MICROSECOND AS i, "
        "{'a': 1, 'b': [1, 2]} AS s, MAP {'k': 7} AS m, 1.25::DECIMAL(10, 2) AS d, "
        "TIMESTAMP '2024-01-02 03:04:05.5' AS t, DATE '2024-01-02' AS dt, "
        "[DATE '2024-01-03'] AS ld"
    )
    msgs = list(qd.client.stub.Query(pb.QueryRequest(sql=sql)))
    values = [r for m in msgs for r in m.rows][0].values
    text = [v.string_value for v in values]
    assert json.loads(text[0]) == {"months": 1, "days": 2, "nanoseconds": 3000}
    assert json.loads(text[1]) == {"a": 1, "b": [1, 2]}
    assert json.loads(text[2]) == [{"key": "k", "value": 7}]
    assert text[3] == "1.25"
    assert text[4] == "2024-01-02T03:04:05.500000"
    assert text[5] == "2024-01-02"
    assert json.loads(text[6]) == ["2024-01-03"]
    assert not any("MonthDayNano" in t or "Decimal(" in t or "datetime" in t for t in text)
