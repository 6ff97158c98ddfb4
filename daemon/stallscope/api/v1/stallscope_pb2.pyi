from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    SPAN: _ClassVar[EventKind]
    GC_PASS: _ClassVar[EventKind]
    OFF_CPU: _ClassVar[EventKind]
    RUN_QUEUE: _ClassVar[EventKind]
    MIGRATION: _ClassVar[EventKind]
    GPU_SAMPLE: _ClassVar[EventKind]
    STALL_ALERT: _ClassVar[EventKind]
    HUNG: _ClassVar[EventKind]
    REQUEST_FINISHED: _ClassVar[EventKind]

class ResultFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROWS: _ClassVar[ResultFormat]
    ARROW_IPC: _ClassVar[ResultFormat]
EVENT_KIND_UNSPECIFIED: EventKind
SPAN: EventKind
GC_PASS: EventKind
OFF_CPU: EventKind
RUN_QUEUE: EventKind
MIGRATION: EventKind
GPU_SAMPLE: EventKind
STALL_ALERT: EventKind
HUNG: EventKind
REQUEST_FINISHED: EventKind
ROWS: ResultFormat
ARROW_IPC: ResultFormat

class StreamEventsRequest(_message.Message):
    __slots__ = ("kinds", "span_kinds", "run_ids", "pids", "min_duration_ns", "max_queue_events")
    KINDS_FIELD_NUMBER: _ClassVar[int]
    SPAN_KINDS_FIELD_NUMBER: _ClassVar[int]
    RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    MIN_DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedScalarFieldContainer[EventKind]
    span_kinds: _containers.RepeatedScalarFieldContainer[str]
    run_ids: _containers.RepeatedScalarFieldContainer[int]
    pids: _containers.RepeatedScalarFieldContainer[int]
    min_duration_ns: int
    max_queue_events: int
    def __init__(self, kinds: _Optional[_Iterable[_Union[EventKind, str]]] = ..., span_kinds: _Optional[_Iterable[str]] = ..., run_ids: _Optional[_Iterable[int]] = ..., pids: _Optional[_Iterable[int]] = ..., min_duration_ns: _Optional[int] = ..., max_queue_events: _Optional[int] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("events", "sent_ns")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    SENT_NS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    sent_ns: int
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., sent_ns: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "span", "gc_pass", "off_cpu", "run_queue", "migration", "gpu_sample", "stall_alert", "dropped", "hung", "request_finished")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SPAN_FIELD_NUMBER: _ClassVar[int]
    GC_PASS_FIELD_NUMBER: _ClassVar[int]
    OFF_CPU_FIELD_NUMBER: _ClassVar[int]
    RUN_QUEUE_FIELD_NUMBER: _ClassVar[int]
    MIGRATION_FIELD_NUMBER: _ClassVar[int]
    GPU_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    STALL_ALERT_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    HUNG_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FINISHED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    span: Span
    gc_pass: GcPass
    off_cpu: OffCpu
    run_queue: RunQueueWait
    migration: Migration
    gpu_sample: GpuSample
    stall_alert: StallAlert
    dropped: Dropped
    hung: Hung
    request_finished: RequestFinished
    def __init__(self, seq: _Optional[int] = ..., span: _Optional[_Union[Span, _Mapping]] = ..., gc_pass: _Optional[_Union[GcPass, _Mapping]] = ..., off_cpu: _Optional[_Union[OffCpu, _Mapping]] = ..., run_queue: _Optional[_Union[RunQueueWait, _Mapping]] = ..., migration: _Optional[_Union[Migration, _Mapping]] = ..., gpu_sample: _Optional[_Union[GpuSample, _Mapping]] = ..., stall_alert: _Optional[_Union[StallAlert, _Mapping]] = ..., dropped: _Optional[_Union[Dropped, _Mapping]] = ..., hung: _Optional[_Union[Hung, _Mapping]] = ..., request_finished: _Optional[_Union[RequestFinished, _Mapping]] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("run_id", "pid", "tid", "kind", "stage", "batch", "start_ns", "end_ns", "duration_ns", "depth", "seq")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    run_id: int
    pid: int
    tid: int
    kind: str
    stage: str
    batch: int
    start_ns: int
    end_ns: int
    duration_ns: int
    depth: int
    seq: int
    def __init__(self, run_id: _Optional[int] = ..., pid: _Optional[int] = ..., tid: _Optional[int] = ..., kind: _Optional[str] = ..., stage: _Optional[str] = ..., batch: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., duration_ns: _Optional[int] = ..., depth: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class GcPass(_message.Message):
    __slots__ = ("run_id", "pid", "tid", "generation", "start_ns", "end_ns", "duration_ns", "collected", "uncollectable")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    COLLECTED_FIELD_NUMBER: _ClassVar[int]
    UNCOLLECTABLE_FIELD_NUMBER: _ClassVar[int]
    run_id: int
    pid: int
    tid: int
    generation: int
    start_ns: int
    end_ns: int
    duration_ns: int
    collected: int
    uncollectable: int
    def __init__(self, run_id: _Optional[int] = ..., pid: _Optional[int] = ..., tid: _Optional[int] = ..., generation: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., duration_ns: _Optional[int] = ..., collected: _Optional[int] = ..., uncollectable: _Optional[int] = ...) -> None: ...

class OffCpu(_message.Message):
    __slots__ = ("pid", "tid", "start_ns", "end_ns", "duration_ns", "preempted", "cpu", "resolution_ns", "window_offcpu_ns", "window_events", "window_preempted_events")
    PID_FIELD_NUMBER: _ClassVar[int]
    TID_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_NS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_OFFCPU_NS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_EVENTS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_PREEMPTED_EVENTS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    tid: int
    start_ns: int
    end_ns: int
    duration_ns: int
    preempted: bool
    cpu: int
    resolution_ns: int
    window_offcpu_ns: int
    window_events: int
    window_preempted_events: int
    def __init__(self, pid: _Optional[int] = ..., tid: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., duration_ns: _Optional[int] = ..., preempted: _Optional[bool] = ..., cpu: _Optional[int] = ..., resolution_ns: _Optional[int] = ..., window_offcpu_ns: _Optional[int] = ..., window_events: _Optional[int] = ..., window_preempted_events: _Optional[int] = ...) -> None: ...

class RunQueueWait(_message.Message):
    __slots__ = ("pid", "tid", "start_ns", "end_ns", "duration_ns", "cpu", "resolution_ns", "window_wait_ns", "window_events")
    PID_FIELD_NUMBER: _ClassVar[int]
    TID_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_NS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_EVENTS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    tid: int
    start_ns: int
    end_ns: int
    duration_ns: int
    cpu: int
    resolution_ns: int
    window_wait_ns: int
    window_events: int
    def __init__(self, pid: _Optional[int] = ..., tid: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., duration_ns: _Optional[int] = ..., cpu: _Optional[int] = ..., resolution_ns: _Optional[int] = ..., window_wait_ns: _Optional[int] = ..., window_events: _Optional[int] = ...) -> None: ...

class Migration(_message.Message):
    __slots__ = ("pid", "tid", "ts_ns", "from_cpu", "to_cpu", "resolution_ns", "window_events")
    PID_FIELD_NUMBER: _ClassVar[int]
    TID_FIELD_NUMBER: _ClassVar[int]
    TS_NS_FIELD_NUMBER: _ClassVar[int]
    FROM_CPU_FIELD_NUMBER: _ClassVar[int]
    TO_CPU_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_NS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_EVENTS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    tid: int
    ts_ns: int
    from_cpu: int
    to_cpu: int
    resolution_ns: int
    window_events: int
    def __init__(self, pid: _Optional[int] = ..., tid: _Optional[int] = ..., ts_ns: _Optional[int] = ..., from_cpu: _Optional[int] = ..., to_cpu: _Optional[int] = ..., resolution_ns: _Optional[int] = ..., window_events: _Optional[int] = ...) -> None: ...

class GpuSample(_message.Message):
    __slots__ = ("gpu", "ts_ns", "sm_clock_mhz", "mem_clock_mhz", "power_mw", "temp_c", "util_pct", "clock_event_reasons", "source")
    GPU_FIELD_NUMBER: _ClassVar[int]
    TS_NS_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    MEM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    POWER_MW_FIELD_NUMBER: _ClassVar[int]
    TEMP_C_FIELD_NUMBER: _ClassVar[int]
    UTIL_PCT_FIELD_NUMBER: _ClassVar[int]
    CLOCK_EVENT_REASONS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    gpu: int
    ts_ns: int
    sm_clock_mhz: int
    mem_clock_mhz: int
    power_mw: int
    temp_c: int
    util_pct: int
    clock_event_reasons: int
    source: str
    def __init__(self, gpu: _Optional[int] = ..., ts_ns: _Optional[int] = ..., sm_clock_mhz: _Optional[int] = ..., mem_clock_mhz: _Optional[int] = ..., power_mw: _Optional[int] = ..., temp_c: _Optional[int] = ..., util_pct: _Optional[int] = ..., clock_event_reasons: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class StallAlert(_message.Message):
    __slots__ = ("run_id", "pid", "tid", "stage", "batch", "start_ns", "end_ns", "duration_ns", "baseline_ns", "ratio", "gc_overlap_ns", "gc_generation", "offcpu_ns", "preempted_ns", "cause", "offcpu_sampled")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_NS_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    GC_OVERLAP_NS_FIELD_NUMBER: _ClassVar[int]
    GC_GENERATION_FIELD_NUMBER: _ClassVar[int]
    OFFCPU_NS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_NS_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    OFFCPU_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    run_id: int
    pid: int
    tid: int
    stage: str
    batch: int
    start_ns: int
    end_ns: int
    duration_ns: int
    baseline_ns: int
    ratio: float
    gc_overlap_ns: int
    gc_generation: int
    offcpu_ns: int
    preempted_ns: int
    cause: str
    offcpu_sampled: bool
    def __init__(self, run_id: _Optional[int] = ..., pid: _Optional[int] = ..., tid: _Optional[int] = ..., stage: _Optional[str] = ..., batch: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., duration_ns: _Optional[int] = ..., baseline_ns: _Optional[int] = ..., ratio: _Optional[float] = ..., gc_overlap_ns: _Optional[int] = ..., gc_generation: _Optional[int] = ..., offcpu_ns: _Optional[int] = ..., preempted_ns: _Optional[int] = ..., cause: _Optional[str] = ..., offcpu_sampled: _Optional[bool] = ...) -> None: ...

class Hung(_message.Message):
    __slots__ = ("state", "run_id", "pid", "dump_id", "detected_ns", "threshold_ns", "last_step_end_ns", "recovered_ns", "threads", "lacks", "reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    DUMP_ID_FIELD_NUMBER: _ClassVar[int]
    DETECTED_NS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_NS_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_END_NS_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_NS_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    LACKS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    state: str
    run_id: int
    pid: int
    dump_id: int
    detected_ns: int
    threshold_ns: int
    last_step_end_ns: int
    recovered_ns: int
    threads: int
    lacks: str
    reason: str
    def __init__(self, state: _Optional[str] = ..., run_id: _Optional[int] = ..., pid: _Optional[int] = ..., dump_id: _Optional[int] = ..., detected_ns: _Optional[int] = ..., threshold_ns: _Optional[int] = ..., last_step_end_ns: _Optional[int] = ..., recovered_ns: _Optional[int] = ..., threads: _Optional[int] = ..., lacks: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RequestFinished(_message.Message):
    __slots__ = ("run_id", "pid", "request_id", "text", "end_event", "end_ns", "arrival_ns", "ttft_ns", "e2e_ns", "output_tokens", "itl_max_ns")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    END_EVENT_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_NS_FIELD_NUMBER: _ClassVar[int]
    TTFT_NS_FIELD_NUMBER: _ClassVar[int]
    E2E_NS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ITL_MAX_NS_FIELD_NUMBER: _ClassVar[int]
    run_id: int
    pid: int
    request_id: int
    text: str
    end_event: str
    end_ns: int
    arrival_ns: int
    ttft_ns: int
    e2e_ns: int
    output_tokens: int
    itl_max_ns: int
    def __init__(self, run_id: _Optional[int] = ..., pid: _Optional[int] = ..., request_id: _Optional[int] = ..., text: _Optional[str] = ..., end_event: _Optional[str] = ..., end_ns: _Optional[int] = ..., arrival_ns: _Optional[int] = ..., ttft_ns: _Optional[int] = ..., e2e_ns: _Optional[int] = ..., output_tokens: _Optional[int] = ..., itl_max_ns: _Optional[int] = ...) -> None: ...

class Dropped(_message.Message):
    __slots__ = ("count", "total", "reason", "from_ns", "to_ns", "kinds")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FROM_NS_FIELD_NUMBER: _ClassVar[int]
    TO_NS_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    count: int
    total: int
    reason: str
    from_ns: int
    to_ns: int
    kinds: _containers.RepeatedScalarFieldContainer[EventKind]
    def __init__(self, count: _Optional[int] = ..., total: _Optional[int] = ..., reason: _Optional[str] = ..., from_ns: _Optional[int] = ..., to_ns: _Optional[int] = ..., kinds: _Optional[_Iterable[_Union[EventKind, str]]] = ...) -> None: ...

class QueryRequest(_message.Message):
    __slots__ = ("sql", "params", "max_rows", "timeout_ms", "format", "batch_rows", "max_message_bytes")
    SQL_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    MAX_ROWS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    sql: str
    params: _containers.RepeatedCompositeFieldContainer[Value]
    max_rows: int
    timeout_ms: int
    format: ResultFormat
    batch_rows: int
    max_message_bytes: int
    def __init__(self, sql: _Optional[str] = ..., params: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., max_rows: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., format: _Optional[_Union[ResultFormat, str]] = ..., batch_rows: _Optional[int] = ..., max_message_bytes: _Optional[int] = ...) -> None: ...

class Column(_message.Message):
    __slots__ = ("name", "type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("is_null", "int_value", "double_value", "string_value", "bool_value", "bytes_value", "uint_value")
    IS_NULL_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    BYTES_VALUE_FIELD_NUMBER: _ClassVar[int]
    UINT_VALUE_FIELD_NUMBER: _ClassVar[int]
    is_null: bool
    int_value: int
    double_value: float
    string_value: str
    bool_value: bool
    bytes_value: bytes
    uint_value: int
    def __init__(self, is_null: _Optional[bool] = ..., int_value: _Optional[int] = ..., double_value: _Optional[float] = ..., string_value: _Optional[str] = ..., bool_value: _Optional[bool] = ..., bytes_value: _Optional[bytes] = ..., uint_value: _Optional[int] = ...) -> None: ...

class Row(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class QueryResponse(_message.Message):
    __slots__ = ("columns", "rows", "arrow_ipc", "done", "truncated", "total_rows", "elapsed_us")
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ROWS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_US_FIELD_NUMBER: _ClassVar[int]
    columns: _containers.RepeatedCompositeFieldContainer[Column]
    rows: _containers.RepeatedCompositeFieldContainer[Row]
    arrow_ipc: bytes
    done: bool
    truncated: bool
    total_rows: int
    elapsed_us: int
    def __init__(self, columns: _Optional[_Iterable[_Union[Column, _Mapping]]] = ..., rows: _Optional[_Iterable[_Union[Row, _Mapping]]] = ..., arrow_ipc: _Optional[bytes] = ..., done: _Optional[bool] = ..., truncated: _Optional[bool] = ..., total_rows: _Optional[int] = ..., elapsed_us: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProbeState(_message.Message):
    __slots__ = ("probe", "backend", "state", "detail", "stats", "stats_json")
    class StatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROBE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    STATS_JSON_FIELD_NUMBER: _ClassVar[int]
    probe: str
    backend: str
    state: str
    detail: str
    stats: _containers.ScalarMap[str, str]
    stats_json: str
    def __init__(self, probe: _Optional[str] = ..., backend: _Optional[str] = ..., state: _Optional[str] = ..., detail: _Optional[str] = ..., stats: _Optional[_Mapping[str, str]] = ..., stats_json: _Optional[str] = ...) -> None: ...

class RunSummary(_message.Message):
    __slots__ = ("run_id", "pid", "label", "python", "started_ns", "connected_ns", "ended_ns", "live", "records", "connections", "host", "realtime_start_ns")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    STARTED_NS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_NS_FIELD_NUMBER: _ClassVar[int]
    ENDED_NS_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    REALTIME_START_NS_FIELD_NUMBER: _ClassVar[int]
    run_id: int
    pid: int
    label: str
    python: str
    started_ns: int
    connected_ns: int
    ended_ns: int
    live: bool
    records: int
    connections: int
    host: str
    realtime_start_ns: int
    def __init__(self, run_id: _Optional[int] = ..., pid: _Optional[int] = ..., label: _Optional[str] = ..., python: _Optional[str] = ..., started_ns: _Optional[int] = ..., connected_ns: _Optional[int] = ..., ended_ns: _Optional[int] = ..., live: _Optional[bool] = ..., records: _Optional[int] = ..., connections: _Optional[int] = ..., host: _Optional[str] = ..., realtime_start_ns: _Optional[int] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("version", "daemon_pid", "uptime_ns", "db_path", "db_bytes", "probes", "connected_runs", "records_received", "client_records_lost", "rows_written", "rows_lost", "pending_rows", "rejections", "subscribers", "stream_events_dropped", "losses_recorded", "realtime_offset_ns", "host", "monotonic_ns", "stream_missing_columns")
    class RejectionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class StreamMissingColumnsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DAEMON_PID_FIELD_NUMBER: _ClassVar[int]
    UPTIME_NS_FIELD_NUMBER: _ClassVar[int]
    DB_PATH_FIELD_NUMBER: _ClassVar[int]
    DB_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_RUNS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    CLIENT_RECORDS_LOST_FIELD_NUMBER: _ClassVar[int]
    ROWS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    ROWS_LOST_FIELD_NUMBER: _ClassVar[int]
    PENDING_ROWS_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERS_FIELD_NUMBER: _ClassVar[int]
    STREAM_EVENTS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    LOSSES_RECORDED_FIELD_NUMBER: _ClassVar[int]
    REALTIME_OFFSET_NS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    MONOTONIC_NS_FIELD_NUMBER: _ClassVar[int]
    STREAM_MISSING_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    version: str
    daemon_pid: int
    uptime_ns: int
    db_path: str
    db_bytes: int
    probes: _containers.RepeatedCompositeFieldContainer[ProbeState]
    connected_runs: _containers.RepeatedCompositeFieldContainer[RunSummary]
    records_received: int
    client_records_lost: int
    rows_written: int
    rows_lost: int
    pending_rows: int
    rejections: _containers.ScalarMap[str, int]
    subscribers: int
    stream_events_dropped: int
    losses_recorded: int
    realtime_offset_ns: int
    host: str
    monotonic_ns: int
    stream_missing_columns: _containers.ScalarMap[str, int]
    def __init__(self, version: _Optional[str] = ..., daemon_pid: _Optional[int] = ..., uptime_ns: _Optional[int] = ..., db_path: _Optional[str] = ..., db_bytes: _Optional[int] = ..., probes: _Optional[_Iterable[_Union[ProbeState, _Mapping]]] = ..., connected_runs: _Optional[_Iterable[_Union[RunSummary, _Mapping]]] = ..., records_received: _Optional[int] = ..., client_records_lost: _Optional[int] = ..., rows_written: _Optional[int] = ..., rows_lost: _Optional[int] = ..., pending_rows: _Optional[int] = ..., rejections: _Optional[_Mapping[str, int]] = ..., subscribers: _Optional[int] = ..., stream_events_dropped: _Optional[int] = ..., losses_recorded: _Optional[int] = ..., realtime_offset_ns: _Optional[int] = ..., host: _Optional[str] = ..., monotonic_ns: _Optional[int] = ..., stream_missing_columns: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("live_only", "page_size", "page_token")
    LIVE_ONLY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    live_only: bool
    page_size: int
    page_token: str
    def __init__(self, live_only: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[RunSummary]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[RunSummary, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class StartDiagnosisRequest(_message.Message):
    __slots__ = ("duration_ms",)
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    duration_ms: int
    def __init__(self, duration_ms: _Optional[int] = ...) -> None: ...

class StartDiagnosisResponse(_message.Message):
    __slots__ = ("until_ns", "probes", "deep")
    UNTIL_NS_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    DEEP_FIELD_NUMBER: _ClassVar[int]
    until_ns: int
    probes: _containers.RepeatedScalarFieldContainer[str]
    deep: bool
    def __init__(self, until_ns: _Optional[int] = ..., probes: _Optional[_Iterable[str]] = ..., deep: _Optional[bool] = ...) -> None: ...

class ExportParquetRequest(_message.Message):
    __slots__ = ("dir",)
    DIR_FIELD_NUMBER: _ClassVar[int]
    dir: str
    def __init__(self, dir: _Optional[str] = ...) -> None: ...

class ExportedTable(_message.Message):
    __slots__ = ("table", "rows")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    table: str
    rows: int
    def __init__(self, table: _Optional[str] = ..., rows: _Optional[int] = ...) -> None: ...

class ExportParquetResponse(_message.Message):
    __slots__ = ("dir", "host", "watermark_ns", "tables", "files", "runs_derived")
    DIR_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_NS_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    RUNS_DERIVED_FIELD_NUMBER: _ClassVar[int]
    dir: str
    host: str
    watermark_ns: int
    tables: _containers.RepeatedCompositeFieldContainer[ExportedTable]
    files: int
    runs_derived: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dir: _Optional[str] = ..., host: _Optional[str] = ..., watermark_ns: _Optional[int] = ..., tables: _Optional[_Iterable[_Union[ExportedTable, _Mapping]]] = ..., files: _Optional[int] = ..., runs_derived: _Optional[_Iterable[int]] = ...) -> None: ...
