"""The stallscope wire format: constants and layouts shared by client and daemon.

Every datagram is one 32-byte header followed by zero or more 32-byte records
(or, for HELLO, a UTF-8 JSON object). All integers are little-endian. This
module is the single source of truth for the layout; `docs/wire-protocol.md`
explains it for humans. Standard library only: it is imported by the probe
client inside other people's serving processes.
"""

import struct
from hashlib import blake2b as _blake2b

MAGIC = 0x5353  # b"SS"
# Version 2 adds the sequence-less SPAN_EXT and COUNTERS records and takes GC
# ring overflows out of the header's drops_full. Version 3 adds the PYLAYOUT
# and PYTHREADS datagrams (the CPU sampler's thread-state report). Version 4
# adds the REQUEST and REQUEST_TEXT records (request lifecycle events). A
# daemon accepts every version in VERSIONS and refuses a newer one
# (`unsupported_version`).
VERSION = 4
VERSIONS = (1, 2, 3, 4)

HEADER_SIZE = 32
RECORD_SIZE = 32

# Datagram kinds (header byte 3).
DGRAM_HELLO = 1  # payload: UTF-8 JSON describing the process and run
DGRAM_RECORDS = 2  # payload: record_count fixed-size records
DGRAM_BYE = 3  # no payload: the client closed; first_seq = its next sequence number

# Record types (record byte 0).
REC_SPAN = 1  # flags=depth, kind_id, tid, start_ns, end_ns, stage_id, batch
REC_GC = 2  # flags=generation, tid, start_ns, end_ns, collected, uncollectable
REC_STRING = 3  # kind_id=string id, bytes 8..31 = UTF-8 name, NUL padded
# Version 2 only; neither carries a sequence number:
REC_SPAN_EXT = 4  # the preceding SPAN's work (start_ns field, i64) and idle (flags)
REC_COUNTERS = 5  # start_ns field = GC records lost to a full GC ring so far (u64)
REC_TYPES = (REC_SPAN, REC_GC, REC_STRING, REC_SPAN_EXT, REC_COUNTERS)
SEQLESS_TYPES = {
    1: (REC_STRING,),
    2: (REC_STRING, REC_SPAN_EXT, REC_COUNTERS),
    3: (REC_STRING, REC_SPAN_EXT, REC_COUNTERS),  # RECORDS did not change in version 3
    4: (REC_STRING, REC_SPAN_EXT, REC_COUNTERS),  # REQUEST and REQUEST_TEXT carry one
}

# SPAN_EXT flags: which fields hold a value, and the idle mark.
EXT_HAS_WORK = 1
EXT_HAS_IDLE = 2
EXT_IDLE = 4

STRING_MAX_BYTES = 24

# magic u16, version u8, kind u8, record_count u16, record_size u16,
# first_seq u64, sent_ns u64, drops_full u32, drops_disconnected u32
HEADER = struct.Struct("<HBBHHQQII")
# rtype u8, flags u8, kind_id u16, tid u32, start_ns u64, end_ns u64,
# a u32 (stage_id | collected), b u32 (batch | uncollectable)
RECORD = struct.Struct("<BBHIQQII")
# rtype u8, flags u8, string id u16, reserved u32, name 24s
STRING_RECORD = struct.Struct("<BBHI24s")
# rtype u8, flags u8, 0 u16, 0 u32, work i64 (SPAN_EXT) or count u64 (COUNTERS), 0 u64, 0, 0
EXT_RECORD = struct.Struct("<BBHIqQII")

assert HEADER.size == HEADER_SIZE and RECORD.size == RECORD_SIZE
assert STRING_RECORD.size == RECORD_SIZE and EXT_RECORD.size == RECORD_SIZE

# Records per datagram: 511 records + header = 16 KiB, far below the Unix
# socket's datagram limit (net.core.wmem_default, ~208 KiB). A send costs
# the engine a syscall and wakes the daemon (tens of microseconds in a VM),
# so a datagram should carry many steps: 511 records are ~128 steps of four
# spans, or 20 ms at 6,000 steps/s.
MAX_RECORDS = 511
DATAGRAM_MAX = HEADER_SIZE + MAX_RECORDS * RECORD_SIZE
HELLO_MAX = 16384

# The tally page: a memfd the client may pass with its HELLO (SCM_RIGHTS,
# one descriptor), in which it keeps, after each send and at close, the
# next sequence number it would use and whether it has closed. The daemon
# reads it when a connection ends without a BYE (a full socket at close, a
# killed process), so such a tail is counted too. u64 next_seq, u64 closed.
TALLY = struct.Struct("<QQ")
TALLY_NAME = "stallscope-tally"  # the memfd's name, as /proc/PID/fd shows it

U32_MAX = 0xFFFFFFFF

# A run event (a spec that could not be attached, a target that was): header
# kind 4, no records, then a UTF-8 JSON object {kind, target, message, ts_ns}
# of at most HELLO_MAX bytes. Sent after HELLO; a daemon that predates it
# counts it as `bad_kind` and carries on.
DGRAM_EVENT = 4

# A request to follow a process with no client (`stallscope run --no-client`):
# header kind 5, no records, then a UTF-8 JSON object {pid, label} of at most
# HELLO_MAX bytes, on a connection that sends no HELLO. The daemon answers on
# the same connection with a datagram of the same kind whose JSON is
# {ok, run_id} or {ok: false, reason}. Never sent by the probe client.
DGRAM_WATCH = 5

# A heap census (probe_client/_census.py): header kind 6, no records, then a
# UTF-8 JSON object {phase, taken_ns, duration_ns, tracked, freeze_count,
# threshold, count, top_n, other, other_types, types: [[module, qualname,
# count], ...]} of at most HELLO_MAX bytes. Sent after HELLO, at connect (or
# warm-up) and close only; a daemon that predates it counts it as `bad_kind`.
DGRAM_CENSUS = 6

# The CPU sampler's thread-state report (version 3; probe_client/_pythreads.py,
# sent by the background flusher, never the hot path). PYLAYOUT: header kind
# 7, no records, then a UTF-8 JSON object of at most HELLO_MAX bytes: this
# interpreter's frame layout as checked against itself, or why it cannot be
# sampled {status: "ok" | "refused: ...", version, hexversion,
# implementation, free_threaded, layout, types, verified, notes, cost_ns};
# once per connection, before any PYTHREADS. PYTHREADS: header kind 8,
# record_count PYTHREAD records (at most MAX_RECORDS), the whole list of the
# interpreter's thread states when it was sent (header sent_ns): sent when it changed, and after
# each (re)connect. Neither carries a sequence number. In a version 1 or 2
# datagram both kinds are `bad_kind`.
DGRAM_PYLAYOUT = 7
DGRAM_PYTHREADS = 8

# A request for every thread's stacks of a traced process (`stallscope
# stacks PID`): header kind 9, no records, then a UTF-8 JSON object {pid} of
# at most HELLO_MAX bytes, on a connection that sends no HELLO. The daemon
# answers only a requester whose SO_PEERCRED uid is 0 or owns the process,
# on the same connection, with datagrams of the same kind: each carries a
# part of one UTF-8 JSON object, header record_count = the parts still to
# come (0 on the last). The object is {ok: true, pid, threads: [{tid, name,
# state, wchan, syscall, source, frames: [[file, function, line], ...]}],
# lacks, capture_ns} or {ok: false, code, reason} with code one of
# STACKS_CODES. Never sent by the probe client; a daemon that predates it
# counts it as `bad_kind` and does not answer.
DGRAM_STACKS = 9
STACKS_PART_MAX = 65536
STACKS_CODES = (
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "UNAVAILABLE",
    "INTERNAL",
)
REC_PYTHREAD = 6
# PYTHREAD flags
PYTHREAD_MORE = 1  # the listing had more threads than one datagram holds
# rtype u8, flags u8, 0 u16, native thread id u32, PyThreadState address u64,
# 0 u64, 0 u64 (the listing's time is the header's sent_ns)
PYTHREAD_RECORD = struct.Struct("<BBHIQQQ")
assert PYTHREAD_RECORD.size == RECORD_SIZE

# Request lifecycle events (version 4; `probe.request`, `probe.request_tokens`).
# Both records carry a sequence number, like SPAN and GC; in a datagram of an
# earlier version they are unknown types (`unknown_record_type`).
# REQUEST: rtype u8, event code u8, flags u16, tid u32, ts_ns u64,
# request_id u64, tokens i32 (when REQ_HAS_TOKENS), 0 u32.
# REQUEST_TEXT: the id a str id was hashed from, sent right after its
# `arrived` REQUEST in the same datagram, in parts of 20 bytes: rtype u8,
# part u8 (0..REQ_TEXT_PARTS-1), length u16 (of the whole UTF-8 id, capped at
# 0xFFFF; above REQ_TEXT_MAX only the first REQ_TEXT_MAX bytes are sent),
# request_id u64, 20 bytes of UTF-8, NUL padded.
REC_REQUEST = 7
REC_REQUEST_TEXT = 8
REQUEST_EVENTS = ("arrived", "scheduled", "token", "preempted", "finished", "aborted")
# event name -> code on the wire (1-based; 0 is never sent)
REQUEST_EVENT_CODES = {name: i + 1 for i, name in enumerate(REQUEST_EVENTS)}
REQ_HAS_TOKENS = 1  # the tokens field holds a value (else NULL)
REQ_STR_ID = 2  # request_id is request_key() of a str id
REQ_TEXT_MAX = 64
REQ_TEXT_PART = 20
REQ_TEXT_PARTS = (REQ_TEXT_MAX + REQ_TEXT_PART - 1) // REQ_TEXT_PART
U64_MAX = (1 << 64) - 1
I32_MAX = (1 << 31) - 1
REQUEST_RECORD = struct.Struct("<BBHIQQiI")
REQUEST_TEXT_RECORD = struct.Struct("<BBHQ20s")
assert REQUEST_RECORD.size == RECORD_SIZE and REQUEST_TEXT_RECORD.size == RECORD_SIZE


def request_key(text_bytes):
    """The 64-bit request id of a str id's UTF-8 bytes: BLAKE2b with an
    8-byte digest, read little-endian. The same in every process and
    language (Python's hash() of a str is salted per process), so a request
    that arrives in one process and is served in another has one id."""
    return int.from_bytes(_blake2b(text_bytes, digest_size=8).digest(), "little")
