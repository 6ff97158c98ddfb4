"""The kinds of live events and which store table each comes from.

Values are those of the proto's `EventKind` enum (protos/stallscope/api/v1/
stallscope.proto): the store's listeners (fanout, alerts) and /metrics use
these plain ints, and only `api/` turns them into messages. A test checks
that every value here equals the enum's.
"""

SPAN = 1  # begin/end pairs from probe clients (steps, submits, ...)
GC_PASS = 2  # garbage-collection passes
OFF_CPU = 3  # a traced thread off CPU
RUN_QUEUE = 4  # a traced thread waiting on a run queue
MIGRATION = 5  # a traced thread moved to another CPU
GPU_SAMPLE = 6  # NVML samples
STALL_ALERT = 7  # a step slower than its running baseline
HUNG = 8  # a hang episode's start and end (the hang watchdog; not a stored table)
REQUEST_FINISHED = 9  # a traced request ended, with its latency (not a stored table)

# Store table -> event kind. Tables not listed here are not streamed.
# `hang_events` is no table: the hang watchdog hands its batches to the
# fanout itself (the stored rows are hang_dumps); nor is `request_finished`
# (store/request_ends.py makes it from request_events batches).
TABLE_KINDS = {
    "spans": SPAN,
    "gc_events": GC_PASS,
    "offcpu": OFF_CPU,
    "runq": RUN_QUEUE,
    "migrations": MIGRATION,
    "nvml_samples": GPU_SAMPLE,
    "stall_alerts": STALL_ALERT,
    "hang_events": HUNG,
    "request_finished": REQUEST_FINISHED,
}
ALL_KINDS = frozenset(TABLE_KINDS.values())
# Interval events: a minimum duration applies to them (point events pass).
INTERVAL_KINDS = frozenset({SPAN, GC_PASS, OFF_CPU, RUN_QUEUE, STALL_ALERT})
# Events that carry a run_id (the others carry a pid).
RUN_KINDS = frozenset({SPAN, GC_PASS, STALL_ALERT, HUNG, REQUEST_FINISHED})
POINT_KINDS = frozenset({MIGRATION, GPU_SAMPLE, HUNG, REQUEST_FINISHED})
