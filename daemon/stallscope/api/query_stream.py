"""The Query rpc's messages: a running QueryRun cut into messages by size.

Stock gRPC clients (grpc-js, grpc-java, grpc-go, Python) refuse messages over
4 MiB unless told otherwise, so a result is cut by rows (batch_rows) *and*
by serialized size (max_message_bytes, 4 MiB by default): a batch whose
message would be larger is split in halves until each part fits, starting
from an estimate made from the Arrow batch's own size so that a wide result
is not built whole first. A single row larger than the limit cannot be cut:
the query fails with QueryTooLarge (RESOURCE_EXHAUSTED) rather than send a
message the client would refuse after the server did the work. It also
maps the sandbox's errors to gRPC status codes. It never runs SQL itself.
"""

import grpc
import pyarrow as pa

from stallscope.api.v1 import stallscope_pb2 as pb
from stallscope.api.values import rows_of
from stallscope.errors import QueryError, QueryRefused, QueryTimeout, QueryTooLarge

DEFAULT_MAX_MESSAGE_BYTES = 4 << 20  # gRPC's usual default receive limit
MAX_MESSAGE_BYTES_CAP = 64 << 20  # the server's own send limit
MIN_MESSAGE_BYTES = 1 << 10

# Error class -> status code; the first match wins (subclasses first).
STATUS_CODES = (
    (QueryTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (QueryRefused, grpc.StatusCode.PERMISSION_DENIED),
    (QueryTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (QueryError, grpc.StatusCode.INVALID_ARGUMENT),
)


def status_code(exc):
    for cls, code in STATUS_CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


def message_limit(requested):
    """The message size limit for a request's max_message_bytes (0 = default)."""
    if not requested or requested <= 0:
        return DEFAULT_MAX_MESSAGE_BYTES
    return max(MIN_MESSAGE_BYTES, min(int(requested), MAX_MESSAGE_BYTES_CAP))


def ipc_bytes(batch):
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _build(batch, arrow, columns):
    msg = pb.QueryResponse()
    if columns:
        msg.columns.extend(columns)
    if arrow:
        msg.arrow_ipc = ipc_bytes(batch)
    else:
        msg.rows.extend(rows_of(batch))
    return msg


def _fit(batch, arrow, columns, limit):
    """Messages for `batch`, each at most `limit` bytes (halving as needed)."""
    msg = _build(batch, arrow, columns)
    if msg.ByteSize() <= limit:
        yield msg
        return
    if batch.num_rows <= 1:
        raise QueryTooLarge(
            f"one result row needs {msg.ByteSize():,} bytes, more than the "
            f"message limit of {limit:,} bytes: select fewer or shorter columns, "
            f"or raise max_message_bytes (at most {MAX_MESSAGE_BYTES_CAP:,})"
        )
    half = batch.num_rows // 2
    yield from _fit(batch.slice(0, half), arrow, columns, limit)
    yield from _fit(batch.slice(half), arrow, (), limit)


def messages(run, arrow, limit, columns):
    """QueryResponse messages for a started QueryRun, the last one `done`."""
    first = True
    for batch in run.batches():
        # Start from an estimate (protobuf rows run ~2x the Arrow bytes for
        # short values) so a wide batch is not serialized whole first.
        per_row = max(1.0, batch.nbytes / max(1, batch.num_rows)) * (1.2 if arrow else 2.0)
        step = max(1, int(limit * 0.8 / per_row))
        for offset in range(0, batch.num_rows, step):
            part = batch.slice(offset, step) if step < batch.num_rows else batch
            for msg in _fit(part, arrow, columns if first else (), limit):
                first = False
                yield msg
    last = pb.QueryResponse(
        done=True,
        truncated=run.truncated,
        total_rows=run.rows,
        elapsed_us=int(run.elapsed_s * 1e6),
    )
    if first:
        last.columns.extend(columns)
    yield last
