"""A small client for the daemon's gRPC API, and `ApiSource` for access.py.

`Client(api_socket)` (or `Client(target="host:port", tls_ca=...)`) wraps the
generated stub: `events(...)` iterates live events, `query(sql)` returns
(columns, rows), `status()` and `runs()` return the protobuf messages.
`ApiSource` gives report, compare and `stallscope query` the same
`query()`/`connection()`/`close()` as a database file opened directly, so
code written against a DuckDB connection runs unchanged through the
daemon's sandboxed Query. It never opens the database itself.
"""

import logging
import os

import grpc
import pyarrow as pa

from stallscope.api.v1 import stallscope_pb2 as pb
from stallscope.api.v1 import stallscope_pb2_grpc as pb_grpc
from stallscope.api.values import to_value
from stallscope.errors import AccessError, ApiError


def _error(exc):
    if isinstance(exc, grpc.RpcError):
        code = exc.code()
        detail = exc.details() or str(code)
        if code == grpc.StatusCode.UNAVAILABLE:
            detail = f"the daemon's API is unavailable ({detail})"
        return ApiError(detail, code)
    return ApiError(str(exc))


class Client:
    """A connection to one daemon's API."""

    def __init__(
        self,
        api_socket=None,
        target=None,
        tls_ca=None,
        tls_cert=None,
        tls_key=None,
        server_name=None,
        channel_options=(),
    ):
        if target is None:
            if not api_socket:
                raise ValueError("give api_socket or target")
            target = "unix:" + os.path.abspath(api_socket)
        options = [("grpc.max_receive_message_length", 64 << 20)] + list(channel_options)
        if tls_ca or tls_cert:

            def read(p):
                if not p:
                    return None
                with open(p, "rb") as f:
                    return f.read()

            creds = grpc.ssl_channel_credentials(read(tls_ca), read(tls_key), read(tls_cert))
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
            self.channel = grpc.secure_channel(target, creds, options=options)
        else:
            self.channel = grpc.insecure_channel(target, options=options)
        self.stub = pb_grpc.StallscopeStub(self.channel)
        self.target = target

    def wait_ready(self, timeout_s=10):
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise ApiError(f"no daemon API answers at {self.target}") from None

    # ----- rpcs ------------------------------------------------------------------
    def events(
        self, kinds=(), span_kinds=(), run_ids=(), pids=(), min_duration_ns=0, max_queue_events=0
    ):
        """The raw stream of EventBatch messages (cancel() it to stop)."""
        return self.stub.StreamEvents(
            pb.StreamEventsRequest(
                kinds=kinds,
                span_kinds=span_kinds,
                run_ids=run_ids,
                pids=pids,
                min_duration_ns=min_duration_ns,
                max_queue_events=max_queue_events,
            )
        )

    def query_arrow(self, sql, params=None, limit=None, timeout_ms=0):
        """(pa.Table, truncated) for one read-only statement."""
        request = pb.QueryRequest(
            sql=sql,
            params=[to_value(p) for p in (params or [])],
            max_rows=limit or 0,
            timeout_ms=timeout_ms,
            format=pb.ARROW_IPC,
        )
        batches, columns, truncated = [], [], False
        try:
            for msg in self.stub.Query(request):
                if msg.columns:
                    columns = [(c.name, c.type) for c in msg.columns]
                if msg.arrow_ipc:
                    batches.extend(pa.ipc.open_stream(msg.arrow_ipc).read_all().to_batches())
                if msg.done:
                    truncated = msg.truncated
        except grpc.RpcError as exc:
            raise _error(exc) from None
        if batches:
            table = pa.Table.from_batches(batches)
        else:
            table = pa.table({name: pa.array([], pa.null()) for name, _ in columns})
        return table, columns, truncated

    def query(self, sql, params=None, limit=None, timeout_ms=0):
        """(column names, rows as tuples)."""
        table, columns, _ = self.query_arrow(sql, params, limit, timeout_ms)
        return [c for c, _ in columns], _rows(table)

    def status(self):
        try:
            return self.stub.GetStatus(pb.GetStatusRequest())
        except grpc.RpcError as exc:
            raise _error(exc) from None

    def runs(self, live_only=False):
        try:
            return list(self.stub.ListRuns(pb.ListRunsRequest(live_only=live_only)).runs)
        except grpc.RpcError as exc:
            raise _error(exc) from None

    def export_parquet(self, out_dir=""):
        """Ask the daemon to export to its Parquet directory: ExportParquetResponse."""
        try:
            return self.stub.ExportParquet(pb.ExportParquetRequest(dir=out_dir or ""))
        except grpc.RpcError as exc:
            raise _error(exc) from None

    def start_diagnosis(self, duration_s):
        """Open (or extend) a diagnosis window: StartDiagnosisResponse."""
        try:
            return self.stub.StartDiagnosis(
                pb.StartDiagnosisRequest(duration_ms=int(round(duration_s * 1000)))
            )
        except grpc.RpcError as exc:
            raise _error(exc) from None

    def close(self):
        self.channel.close()


def _rows(table):
    cols = [c.to_pylist() for c in table.columns]
    return list(zip(*cols, strict=True)) if cols else []


class _Cursor:
    """What DuckDB's execute() returns, enough for report and compare code."""

    def __init__(self, table, columns):
        self._table = table
        self._rows_cache = None  # Python rows, made on the first fetch*
        self._pos = 0
        # DB-API description: (name, type_code, display_size, internal_size,
        # precision, scale, null_ok); type_code is DuckDB's type name.
        self.description = [(n, t, None, None, None, None, None) for n, t in columns] or None

    @property
    def _rows(self):
        if self._rows_cache is None:
            self._rows_cache = _rows(self._table)
        return self._rows_cache

    def fetchall(self):
        rows, self._pos = self._rows[self._pos :], len(self._rows)
        return rows

    def fetchone(self):
        if self._pos >= len(self._rows):
            return None
        self._pos += 1
        return self._rows[self._pos - 1]

    def fetchmany(self, size=1):
        rows = self._rows[self._pos : self._pos + size]
        self._pos += len(rows)
        return rows

    def fetchnumpy(self):
        """Columns as numpy arrays, as DuckDB's fetchnumpy(): NULLs masked."""
        import numpy as np

        out = {}
        for name, col in zip(self._table.column_names, self._table.columns, strict=True):
            values = col.to_numpy(zero_copy_only=False)
            if col.null_count:
                out[name] = np.ma.masked_array(
                    values, mask=col.is_null().to_numpy(zero_copy_only=False)
                )
            else:
                out[name] = values
        return out


class ApiConnection:
    """A DuckDB-connection look-alike whose execute() runs through Query."""

    def __init__(self, source):
        self._source = source
        self._last = None

    def execute(self, sql, params=None):
        self._last = self._source._execute(sql, params)
        return self._last

    def cursor(self):
        return ApiConnection(self._source)

    def fetchall(self):
        return self._last.fetchall() if self._last else []

    def fetchone(self):
        return self._last.fetchone() if self._last else None

    @property
    def description(self):
        return self._last.description if self._last else None

    def close(self):
        pass


# Without a limit, ask for as many rows as the server allows (a file opened
# directly has none); a cut result is logged, never silent.
UNLIMITED_ROWS = 10_000_000


class ApiSource:
    """Read access through a running daemon (access.py's other source)."""

    def __init__(self, api_socket, limit=None):
        self.client = Client(api_socket)
        self.default_limit = limit

    def _execute(self, sql, params=None, limit=None):
        limit = limit or self.default_limit or UNLIMITED_ROWS
        try:
            table, columns, truncated = self.client.query_arrow(sql, params, limit)
        except ApiError as exc:
            raise AccessError(str(exc)) from None
        if truncated and limit >= UNLIMITED_ROWS:
            logging.getLogger(__name__).warning(
                "the daemon cut this result at %d rows", table.num_rows
            )
        return _Cursor(table, columns)

    def query(self, sql, params=None, limit=None):
        cur = self._execute(sql, params, limit)
        return [d[0] for d in cur.description or []], cur.fetchall()

    def connection(self):
        return ApiConnection(self)

    def close(self):
        self.client.close()
