"""Request lifecycle events: `probe.request()` and `probe.request_tokens()`.

A serving engine says when each request arrived, was scheduled, produced
tokens, was preempted and finished (or was aborted); the daemon joins each
event to the step span of the same thread that contains it. This is a mixin
of `Probe` and keeps its hot-path rules: one REQUEST record (wire version 4)
per event packed into the preallocated buffer under the buffer lock, no
GC-tracked object made (ids, codes and counts are ints; a str id's UTF-8
bytes and its digest are bytes, which the collector does not track), no
send except when the buffer is full (the step's end or the flusher sends),
and nothing raised: a bad event name, a negative or oversized token count or
an id that is neither int nor str is counted in `errors` and
`request_errors` and dropped. A str id is hashed at each call
(`wire.request_key`, BLAKE2b-64, the same in every process), with no table
kept; its text (at most `wire.REQ_TEXT_MAX` bytes of UTF-8) goes once, with
`arrived`, in REQUEST_TEXT records right after the REQUEST in the same
datagram. On the C record write (`_accel.c`), an event without text and
the batches with one count are written by its `request_one` and
`request_tokens` (the same bytes; int ids and ASCII str ids, which it
hashes itself) whenever no thread holds the buffer lock and no send is
due; everything else, and those when declined, by this Python code.
"""

from operator import index as _index

from . import wire
from ._transport import _monotonic_ns

_pack_req = wire.REQUEST_RECORD.pack_into
_pack_text = wire.REQUEST_TEXT_RECORD.pack_into
_REC_REQUEST = wire.REC_REQUEST
_REC_TEXT = wire.REC_REQUEST_TEXT
_CODES = wire.REQUEST_EVENT_CODES
_TOKEN = wire.REQUEST_EVENT_CODES["token"]
_ARRIVED = wire.REQUEST_EVENT_CODES["arrived"]
_HAS_TOKENS = wire.REQ_HAS_TOKENS
_STR_ID = wire.REQ_STR_ID
_U64 = wire.U64_MAX
_I32 = wire.I32_MAX
_TEXT_MAX = wire.REQ_TEXT_MAX
_PART = wire.REQ_TEXT_PART
_HDR = wire.HEADER_SIZE
_RS = wire.RECORD_SIZE
_key = wire.request_key
# A write needs room for its REQUEST and, with `arrived` of a str id, every
# REQUEST_TEXT part; a batch needs room for one record at a time.
_ROOM_ONE = wire.DATAGRAM_MAX - _RS
_ROOM_ARRIVED = wire.DATAGRAM_MAX - (1 + wire.REQ_TEXT_PARTS) * _RS


def request_key(request_id):
    """The 64-bit id the daemon stores for `request_id` (an int, masked to
    64 bits, or a str, hashed): for engines that hash a str id once and
    pass the int to later calls."""
    if isinstance(request_id, str):
        return _key(request_id.encode("utf-8", "surrogatepass"))
    return _index(request_id) & _U64


class RequestEvents:
    """The request-event half of `Probe` (a mixin: state lives on the Probe)."""

    def _init_requests(self):
        self.request_errors = 0  # calls dropped for bad arguments (also in errors)
        # The C batch write (_accel.request_tokens) asks the lock whether it
        # is held: the bound method made once (it holds the lock, not the probe)
        self._lock_held = self._lock.locked
        # None without the C write, or with a build of _accel.c older than it
        self._accel_tokens = getattr(self._accel, "request_tokens", None)
        self._accel_one = getattr(self._accel, "request_one", None)

    def request(self, request_id, event, tokens=None, ts_ns=None):
        """Record `event` of request `request_id` now; never raises.

        `event` is one of arrived, scheduled, token, preempted, finished,
        aborted; `tokens` is how many tokens this step produced for it (a
        `token` event without a count means 1; other events may carry one,
        e.g. the prompt's length with `arrived`). `request_id` is an int or
        a str (hashed to 64 bits here; its text is sent once, with
        `arrived`). `ts_ns` (CLOCK_MONOTONIC ns, time.monotonic_ns()) is
        when it happened if not now: a request form records the call's
        start, the id being known only once the call returned."""
        try:
            t = _monotonic_ns() if ts_ns is None else ts_ns
            code = _CODES.get(event)
            if code is None:
                self._bad_request()
                return
            if tokens is None:
                if code == _TOKEN:
                    flags, n = _HAS_TOKENS, 1
                else:
                    flags, n = 0, 0
            else:
                n = _index(tokens)
                if n < 0 or n > _I32:
                    self._bad_request()
                    return
                flags = _HAS_TOKENS
            try:  # the thread's id, read once per thread (a syscall-free lookup)
                tid = self._local.st.tid
            except AttributeError:
                tid = self._thread_state().tid
            one = self._accel_one
            if one is not None and one(
                self.__dict__, self._buf, self._lock_held, _ROOM_ONE, t, tid, code, flags,
                request_id, n,
            ):  # fmt: skip
                return  # written in C: an int or ASCII str id, no text, no send due
            if type(request_id) is int:
                rid = request_id & _U64
                raw = None
            elif isinstance(request_id, str):
                raw = request_id.encode("utf-8", "surrogatepass")
                rid = _key(raw)
                flags |= _STR_ID
                if code != _ARRIVED:
                    raw = None
            else:
                rid = _index(request_id) & _U64
                raw = None
            self._lock.acquire()
            try:
                pos = self._pos
                if pos >= (_ROOM_ONE if raw is None else _ROOM_ARRIVED):
                    self._drain_gc_locked()
                    self._send_locked(t)
                    pos = self._pos
                _pack_req(self._buf, pos, _REC_REQUEST, code, flags, tid, t, rid, n, 0)
                pos += _RS
                if raw is not None:
                    length = len(raw)
                    sent = length if length < _TEXT_MAX else _TEXT_MAX
                    part = 0
                    off = 0
                    while off < sent:
                        end = off + _PART
                        if end > sent:
                            end = sent
                        _pack_text(
                            self._buf,
                            pos,
                            _REC_TEXT,
                            part,
                            length if length < 0xFFFF else 0xFFFF,
                            rid,
                            raw[off:end],
                        )
                        pos += _RS
                        part += 1
                        off = end
                self._pos = pos
            finally:
                self._lock.release()
        except Exception:  # an id or count that is not an integer, an unhashable event
            self._bad_request()

    def request_tokens(self, ids, counts):
        """One `token` event per request of a batch, all at one time and
        thread: `ids[i]` produced `counts[i]` tokens this step (`counts` may
        also be one int for all). Never raises; a bad id or count drops that
        request's event only (counted)."""
        try:
            t = _monotonic_ns()
            try:
                tid = self._local.st.tid
            except AttributeError:
                tid = self._thread_state().tid
            same = None
            if isinstance(counts, int):
                same = counts
                if same < 0 or same > _I32:
                    self._bad_request(len(ids))
                    return
            bad = 0
            start = 0
            accel = self._accel_tokens
            if accel is not None and same is not None:
                # int and ASCII str ids with one count, written in C while no thread
                # holds the lock (byte for byte what the loop below
                # writes); it stops where the Python path must go on
                start = accel(
                    self.__dict__, self._buf, self._lock_held, _ROOM_ONE, t, tid, ids, same
                )
                if start == len(ids):
                    return
            buf = self._buf
            pack = _pack_req
            self._lock.acquire()
            try:
                pos = self._pos
                for i in range(start, len(ids)):
                    rid = ids[i]
                    if same is None:
                        try:
                            n = _index(counts[i])
                        except Exception:
                            bad += 1
                            continue
                        if n < 0 or n > _I32:
                            bad += 1
                            continue
                    else:
                        n = same
                    if type(rid) is int:
                        flags = _HAS_TOKENS
                        rid &= _U64
                    elif isinstance(rid, str):
                        rid = _key(rid.encode("utf-8", "surrogatepass"))
                        flags = _HAS_TOKENS | _STR_ID
                    else:
                        try:
                            rid = _index(rid) & _U64
                        except Exception:
                            bad += 1
                            continue
                        flags = _HAS_TOKENS
                    if pos >= _ROOM_ONE:
                        # the buffer's position is kept in a local for the
                        # loop; the send needs it (and resets it)
                        self._pos = pos
                        self._drain_gc_locked()
                        self._send_locked(t)
                        pos = self._pos
                    pack(buf, pos, _REC_REQUEST, _TOKEN, flags, tid, t, rid, n, 0)
                    pos += _RS
                self._pos = pos
            finally:
                self._lock.release()
            if bad:
                self._bad_request(bad)
        except Exception:
            self.errors += 1

    def _bad_request(self, n=1):
        self.request_errors += n
        self.errors += n
