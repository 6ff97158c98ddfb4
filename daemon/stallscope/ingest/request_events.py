"""Request lifecycle records at ingest: REQUEST and REQUEST_TEXT into `requests` and `request_events`.

A mixin of `Ingest`, called by `RecordDecoder._decode_run` with a run's
decoded records (wire version 4, probe_client/_requests.py). Events are
checked with numpy, one array operation per rule, and what breaks a rule is
counted in `ingest_errors`, never raised, the rest stored: an unknown event
code (`request_unknown_event`), a negative token count
(`request_negative_tokens`), an event of a request after its `finished` or
`aborted` (`request_after_finished`), a str id's text whose hash is not the
request id (`request_id_hash_mismatch`: the text is dropped, the events
kept) and text parts that do not make one id (`bad_request_text`). An open
request silent for `requests.open_timeout_s` of its run's client time is
evicted (`request_open_timeout`; its row ends 'evicted'; a later event of it
is `request_after_eviction`), so open requests are bounded in time.
Request ids are scoped by run group (`runs.group_key`): a process that
only sees a request arrive (vLLM's caller or API server) and the one that
serves it (the engine core) report the same id; the earlier of two runs
of one group whose request is arrival-only is the hand-off, its row ends
'handed' (not open, never evicted; a later event of it in that run is
`request_after_handoff`) and `request_latency` takes the request's arrival
from it. Every good event is a `request_events` row. A request seen for
the first time is a `requests` row appended with its first decode; later
decodes change its row (last event, end, counts, text) through one UPDATE
per flush (`request_statements`, a store flush hook), so the writer does
one statement per flush, not one per request. Per run the decoder remembers
its open requests (their running counts) and the last DONE_MAX ended ones
(to see events after the end); Python work is per request, not per record.
"""

import threading

import numpy as np
import pyarrow as pa

from probe_client import wire
from stallscope.vocab.schema import STORED_NS_SQL

TEXT_DTYPE = np.dtype(
    [
        ("rtype", "u1"),
        ("part", "u1"),
        ("length", "<u2"),
        ("request_id", "<u8"),
        ("text", "S20"),
    ]
)
assert TEXT_DTYPE.itemsize == wire.RECORD_SIZE

EVENT_NAMES = np.array([None, *wire.REQUEST_EVENTS], dtype=object)
_FINISHED = wire.REQUEST_EVENT_CODES["finished"]
_ABORTED = wire.REQUEST_EVENT_CODES["aborted"]
_TOKEN = wire.REQUEST_EVENT_CODES["token"]
_ARRIVED = wire.REQUEST_EVENT_CODES["arrived"]
# Ended requests remembered per run, to count events that come after the
# end; the oldest are forgotten first.
DONE_MAX = 65536
# An open request with no event for requests.open_timeout_s (client time:
# the run's newest event) is evicted: its row's end_event says 'evicted',
# `request_open_timeout` counts it, and a later event of it is
# `request_after_eviction`. Looked for at most once a second of client time.
DEFAULT_OPEN_TIMEOUT_S = 600.0
EVICTED = "evicted"
# A request whose arrival a run of its group reported before the run that
# serves it (vLLM's caller, then its engine core): the arrival's row ends so.
HANDED = "handed"
EVICT_EVERY_NS = 1_000_000_000


class _RunRequests:
    """One run's requests as the decoder knows them."""

    __slots__ = ("open", "done", "evict_at", "group")

    def __init__(self, group=None):
        # request_id -> [last_ns, events, output_tokens, has_text, first_ns, arrival_only]
        self.open = {}
        self.done = {}  # request_id -> None (ended), EVICTED or HANDED, in the order they ended
        self.evict_at = None  # client time of the next look for stale open requests
        self.group = group  # runs.group_key


class RequestDecoder:
    """The request half of `Ingest` (a mixin: state lives on the Ingest)."""

    def _init_requests(self, store, open_timeout_s=DEFAULT_OPEN_TIMEOUT_S):
        self._req_open_timeout_ns = int(open_timeout_s * 1e9)
        self._req_runs = {}  # run_id -> _RunRequests
        self._req_groups = {}  # group_key -> {run_id: _RunRequests} of runs with requests
        self._req_updates = {}  # (run_id, request_id) -> (last_ns, end, events, tokens, text)
        self._req_lock = threading.Lock()
        store.add_flush_hook(self.request_statements)

    def _decode_requests(self, run, recs, rtype, seq):
        """Store the run's REQUEST records of this decode; returns how many
        records were stored (events, and text parts that named a request)."""
        is_req = rtype == wire.REC_REQUEST
        is_text = rtype == wire.REC_REQUEST_TEXT
        if not is_req.any() and not is_text.any():
            return 0
        run_id, pid = run.run_id, run.pid
        state = self._req_runs.get(run_id)
        if state is None:
            group = getattr(run, "group_key", None)
            state = self._req_runs[run_id] = _RunRequests(group)
            if group is not None:
                self._req_groups.setdefault(group, {})[run_id] = state
        texts, text_records = {}, 0
        if is_text.any():
            texts, text_records = self._request_texts(run, recs[is_text].view(TEXT_DTYPE))
        req = recs[is_req]
        code = req["flags"]
        has_tok = (req["kind_id"] & wire.REQ_HAS_TOKENS) != 0
        tokens = req["a"].view("<i4")
        ok = (code >= 1) & (code <= len(wire.REQUEST_EVENTS))
        if not ok.all():
            self._reject(run_id, pid, "request_unknown_event", int((~ok).sum()))
        neg = ok & has_tok & (tokens < 0)
        if neg.any():
            self._reject(run_id, pid, "request_negative_tokens", int(neg.sum()))
            ok &= ~neg
        rid = req["end_ns"]
        # Events after their request's end: ended in an earlier decode, or
        # after the first finished/aborted of this one (in record order,
        # which is each thread's time order).
        at = np.flatnonzero(ok)
        if len(at):
            uniq, inv = np.unique(rid[at], return_inverse=True)
            ends = np.isin(code[at], (_FINISHED, _ABORTED))
            first_end = np.full(len(uniq), len(at), dtype=np.int64)
            np.minimum.at(first_end, inv[ends], np.flatnonzero(ends))
            done = state.done
            gone = [done.get(u, 0) for u in uniq.tolist()]  # 0: open, None: ended
            ended = np.fromiter((g is None for g in gone), dtype=bool, count=len(uniq))
            evicted = np.fromiter((g == EVICTED for g in gone), dtype=bool, count=len(uniq))
            handed = np.fromiter((g == HANDED for g in gone), dtype=bool, count=len(uniq))
            late = ended[inv] | (np.arange(len(at)) > first_end[inv])
            late &= ~(evicted | handed)[inv]
            if late.any():
                self._reject(run_id, pid, "request_after_finished", int(late.sum()))
                ok[at[late]] = False
            for gone_as, reason in ((evicted, "eviction"), (handed, "handoff")):
                if gone_as.any():
                    self._reject(run_id, pid, f"request_after_{reason}", int(gone_as[inv].sum()))
                    ok[at[gone_as[inv]]] = False
        keep = np.flatnonzero(ok)
        if len(keep):
            self._store_requests(
                run_id, state, texts, req[keep], seq[is_req][keep], has_tok[keep], tokens[keep]
            )
            self._evict_stale(run_id, pid, state, int(req["start_ns"][keep].max()))
        elif texts:
            self._note_texts(run_id, state, texts)
        return len(keep) + text_records

    def _store_requests(self, run_id, state, texts, req, seq, has_tok, tokens):
        n = len(req)
        rid = req["end_ns"]
        code = req["flags"]
        ts = req["start_ns"].astype(np.int64)
        # Per request of this decode: first and last time, events, output
        # tokens (of `token` events), and the end if one came.
        uniq, inv = np.unique(rid, return_inverse=True)
        m = len(uniq)
        first = np.full(m, np.iinfo(np.int64).max, dtype=np.int64)
        last = np.full(m, np.iinfo(np.int64).min, dtype=np.int64)
        np.minimum.at(first, inv, ts)
        np.maximum.at(last, inv, ts)
        events = np.bincount(inv, minlength=m)
        out_tok = np.where(has_tok & (code == _TOKEN), tokens, 0).astype(np.int64)
        toks = np.zeros(m, dtype=np.int64)
        np.add.at(toks, inv, out_tok)
        end = np.zeros(m, dtype=np.int64)
        ends = np.isin(code, (_FINISHED, _ABORTED))
        end[inv[ends]] = code[ends]
        arrival_only = np.bincount(inv, weights=code != _ARRIVED, minlength=m) == 0
        peers = self._group_peers(run_id, state)
        new = {k: [] for k in ("request_id", "text", "first_ns", "last_ns", "end", "ev", "tok")}
        updates = []
        for i, key in enumerate(uniq.tolist()):
            text = texts.pop(key, None)
            end_name = EVENT_NAMES[end[i]] if end[i] else None
            known = state.open.get(key)
            if known is None:
                only = bool(arrival_only[i])
                # also when this decode holds its whole life: the peer's
                # arrival-only sighting is ended 'handed' then
                if peers and self._handoff(peers, key, int(first[i]), only):
                    end_name = HANDED  # another run of the group serves it
                new["request_id"].append(key)
                new["text"].append(text)
                new["first_ns"].append(int(first[i]))
                new["last_ns"].append(int(last[i]))
                new["end"].append(end_name)
                new["ev"].append(int(events[i]))
                new["tok"].append(int(toks[i]))
                known = [int(last[i]), int(events[i]), int(toks[i]), text is not None,
                         int(first[i]), only]  # fmt: skip
                if end_name is None:
                    state.open[key] = known
            else:
                known[0] = max(known[0], int(last[i]))
                known[1] += int(events[i])
                known[2] += int(toks[i])
                known[5] = known[5] and bool(arrival_only[i])
                if text is not None:
                    known[3] = True
                updates.append((key, known[0], end_name, known[1], known[2], text))
                if end_name is not None:
                    del state.open[key]
            if end_name is not None:
                self._remember_done(state, key, end_name if end_name == HANDED else None)
        if new["request_id"]:
            k = len(new["request_id"])
            self.store.append(
                "requests",
                {
                    "run_id": np.full(k, run_id, dtype=np.int64),
                    "request_id": pa.array(new["request_id"], type=pa.uint64()),
                    "text": pa.array(new["text"], type=pa.string()),
                    "first_ns": np.array(new["first_ns"], dtype=np.int64),
                    "last_ns": np.array(new["last_ns"], dtype=np.int64),
                    "end_event": pa.array(new["end"], type=pa.string()),
                    "events": np.array(new["ev"], dtype=np.int64),
                    "output_tokens": np.array(new["tok"], dtype=np.int64),
                },
            )
        # after the new requests' rows: a store listener (the API's
        # RequestFinished feed) then knows a str id's text when its events come
        self.store.append(
            "request_events",
            {
                "run_id": np.full(n, run_id, dtype=np.int64),
                "request_id": pa.array(rid, type=pa.uint64()),
                "event": EVENT_NAMES[code.astype(np.int64)],
                "ts_ns": ts,
                "tid": req["tid"].astype(np.int64),
                "tokens": pa.array(tokens.astype(np.int64), mask=~has_tok, type=pa.int64()),
                "seq": seq,
            },
        )
        if texts:
            self._note_texts(run_id, state, texts)
        if updates:
            with self._req_lock:
                for key, last_ns, end_name, ev, tok, text in updates:
                    prev = self._req_updates.get((run_id, key))
                    if prev is not None:
                        end_name = end_name or prev[1]
                        text = text or prev[4]
                    self._req_updates[(run_id, key)] = (last_ns, end_name, ev, tok, text)

    def _group_peers(self, run_id, state):
        """The other runs of `state`'s group that have requests (often none)."""
        members = self._req_groups.get(state.group)
        if not members or len(members) < 2:
            return ()
        return [(r, st) for r, st in members.items() if r != run_id]

    def _handoff(self, peers, key, first_ns, arrival_only):
        """A request new to its run that another run of its group knows:
        True when this run's sighting is the hand-off (arrival-only, and
        the earlier one or the other already ended); when the other run's
        open sighting is the earlier arrival-only one, that one is ended
        'handed' here. Two runs serving one id both keep their requests."""
        for peer_id, peer in peers:
            other = peer.open.get(key)
            if other is not None:
                if other[5] and other[4] <= first_ns:
                    with self._req_lock:
                        del peer.open[key]
                        prev = self._req_updates.get((peer_id, key))
                        text = prev[4] if prev is not None else None
                        self._req_updates[(peer_id, key)] = (
                            other[0], HANDED, other[1], other[2], text,
                        )  # fmt: skip
                    self._remember_done(peer, key, HANDED)
                    return False
                if arrival_only and first_ns <= other[4]:
                    return True
            elif arrival_only and peer.done.get(key, 0) is None:
                return True  # it was served, and ended, before its arrival was read
        return False

    def _note_texts(self, run_id, state, texts):
        """Texts of requests whose row exists (their `arrived` came in an
        earlier decode): set by the next flush's UPDATE, the rest unchanged."""
        with self._req_lock:
            for key, text in texts.items():
                known = state.open.get(key)
                if known is None:
                    continue  # no event of it was stored: nothing to name
                prev = self._req_updates.get((run_id, key))
                self._req_updates[(run_id, key)] = (
                    (known[0], None, known[1], known[2], text)
                    if prev is None
                    else (*prev[:4], text)
                )

    def _evict_stale(self, run_id, pid, state, now_ns):
        """Open requests of the run silent for open_timeout_s of its client
        time (`now_ns`: its newest event): evicted, their row's end_event
        'evicted' at the next flush, counted."""
        if now_ns < (state.evict_at or now_ns) or not state.open:
            return
        state.evict_at = now_ns + EVICT_EVERY_NS
        cut = now_ns - self._req_open_timeout_ns
        stale = [k for k, known in state.open.items() if known[0] < cut]
        if not stale:
            return
        with self._req_lock:
            for key in stale:
                last_ns, events, tokens = state.open.pop(key)[:3]
                prev = self._req_updates.get((run_id, key))
                text = prev[4] if prev is not None else None
                self._req_updates[(run_id, key)] = (last_ns, EVICTED, events, tokens, text)
                self._remember_done(state, key, EVICTED)
        self._reject(run_id, pid, "request_open_timeout", len(stale))

    @staticmethod
    def _remember_done(state, key, how=None):
        done = state.done
        done[key] = how
        if len(done) > DONE_MAX:
            del done[next(iter(done))]

    def _request_texts(self, run, parts):
        """({request_id: its str id}, records used) from REQUEST_TEXT
        records, each id checked against the hash it must have (when it was
        sent whole)."""
        by_id = {}
        bad = mismatch = 0
        for rid, part, length, text in zip(
            parts["request_id"].tolist(),
            parts["part"].tolist(),
            parts["length"].tolist(),
            parts["text"].tolist(),
            strict=True,
        ):
            by_id.setdefault(rid, []).append((part, length, text))
        out = {}
        used = 0
        for rid, got in by_id.items():
            length = got[0][1]
            sent = min(length, wire.REQ_TEXT_MAX)
            want = -(-sent // wire.REQ_TEXT_PART)
            got.sort()
            if (
                [p for p, _, _ in got] != list(range(want))
                or any(n != length for _, n, _ in got)
                or sent == 0
            ):
                bad += len(got)
                continue
            raw = b"".join(t.ljust(wire.REQ_TEXT_PART, b"\0") for _, _, t in got)[:sent]
            if length <= wire.REQ_TEXT_MAX and wire.request_key(raw) != rid:
                mismatch += 1
                continue
            out[rid] = raw.decode("utf-8", "replace")
            used += len(got)
        if bad:
            self._reject(run.run_id, run.pid, "bad_request_text", bad)
        if mismatch:
            self._reject(run.run_id, run.pid, "request_id_hash_mismatch", mismatch)
        return out, used

    def _forget_request_runs(self):
        """Drop the state of runs ingest no longer holds."""
        for run_id in [r for r in self._req_runs if r not in self.runs]:
            state = self._req_runs.pop(run_id)
            members = self._req_groups.get(state.group)
            if members is not None:
                members.pop(run_id, None)
                if not members:
                    del self._req_groups[state.group]

    def request_statements(self):
        """The store's flush hook: one UPDATE of every `requests` row that
        changed since the last flush (its row was appended earlier)."""
        with self._req_lock:
            updates, self._req_updates = self._req_updates, {}
        if not updates:
            return []
        keys = list(updates)
        vals = [updates[k] for k in keys]
        return [
            (
                "UPDATE requests SET last_ns = greatest(requests.last_ns, u.last_ns), "
                "end_event = coalesce(u.end_event, requests.end_event), events = u.events, "
                "output_tokens = u.output_tokens, text = coalesce(requests.text, u.text), "
                f"stored_ns = {STORED_NS_SQL} FROM (SELECT unnest(?::BIGINT[]) AS run_id, "
                "unnest(?::VARCHAR[])::UBIGINT AS request_id, unnest(?::BIGINT[]) AS last_ns, "
                "unnest(?::VARCHAR[]) AS end_event, unnest(?::BIGINT[]) AS events, "
                "unnest(?::BIGINT[]) AS output_tokens, unnest(?::VARCHAR[]) AS text) u "
                "WHERE requests.run_id = u.run_id AND requests.request_id = u.request_id",
                [
                    [k[0] for k in keys],
                    [str(k[1]) for k in keys],
                    [v[0] for v in vals],
                    [v[1] for v in vals],
                    [v[2] for v in vals],
                    [v[3] for v in vals],
                    [v[4] for v in vals],
                ],
            )
        ]
