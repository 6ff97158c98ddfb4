"""Malformed-datagram generator with an exact model of what the daemon must do.

`Fuzzer.session()` makes the datagrams of one connection: a mix of
truncated, wrong-version, wrong-kind, lying-length, unknown-record-type,
out-of-order and repeated-sequence, missing and duplicate HELLO, garbage
JSON and huge-count datagrams, together with well-formed ones. For each it
updates the model: the rejections the daemon must count (by reason), and per
run the records it must store and the records it must report lost. Tests
compare the daemon's counters and database with the model, so a rejection
that is miscounted, a record stored that should not be, or a loss that is
not reported fails the test. Standard library only; random.Random seeded by
the test, so a failure is reproducible from its seed.
"""

import json
import random
from collections import Counter

from helpers.fuzzwire_values import BAD_HELLOS, HELLO_FIELDS, WEIRD
from probe_client import wire

SEQ_LIMIT = 1 << 62
MAX_DATAGRAM = wire.HEADER_SIZE + wire.HELLO_MAX  # what the daemon reads at once
_HDR = wire.HEADER.pack
_REC = wire.RECORD.pack
_STR = wire.STRING_RECORD.pack


class ModelRun:
    __slots__ = (
        "run_id",
        "expected",
        "stored",
        "lost",
        "names_len",
        "pending",
        "connections",
        "token",
        "pid",
    )

    def __init__(self, run_id, token, pid, first_seq):
        self.run_id = run_id
        self.token = token
        self.pid = pid
        self.expected = first_seq
        self.stored = 0
        self.lost = first_seq
        self.names_len = 1
        self.pending = []  # (kind_id, stage_id) of spans awaiting decode
        self.connections = 1


class Fuzzer:
    """The generator and the model. `live=True` restricts it to what is
    deterministic over a real socket (decode times unknown, no resume)."""

    def __init__(self, seed, live=False):
        self.rng = random.Random(seed)
        self.live = live
        self.expected = Counter()  # reason -> count the daemon must report
        self.runs = []  # ModelRun, in run_id order
        self.by_token = {}  # (token, pid) -> ModelRun
        self.next_run_id = 1
        self.datagrams = 0
        self.kinds = Counter()  # what was generated, for the figures

    # ----- the model's decode step (call when the ingest decodes) -------------------
    def decode(self):
        for run in self.runs:
            if run.pending:
                n = run.names_len
                unknown = sum((k >= n) + (s >= n) for k, s in run.pending)
                if unknown:
                    self.expected["unknown_string_id"] += unknown
                run.pending = []

    # ----- generation --------------------------------------------------------------
    def session(self, pid, n_max):
        """Datagrams of one connection, with the model updated as the daemon
        must handle them. Returns (datagrams, run or None, ended_by_bye)."""
        rng = self.rng
        out = []
        run = None
        names_sent = False
        n = rng.randint(1, n_max)
        for _ in range(n):
            if run is None:
                kind = rng.choices(
                    [
                        "short",
                        "magic",
                        "version",
                        "badkind",
                        "nohello_rec",
                        "nohello_bye",
                        "badhello",
                        "hello_seq",
                        "hello",
                    ],
                    [3, 3, 3, 3, 3, 1, 4, 1, 12],
                )[0]
            else:
                kind = rng.choices(
                    [
                        "short",
                        "magic",
                        "version",
                        "badkind",
                        "duphello",
                        "rsize",
                        "lenlie",
                        "huge",
                        "regress",
                        "seqrange",
                        "empty",
                        "records",
                        "gap",
                        "strings",
                        "bye",
                    ],
                    [2, 2, 2, 2, 2, 2, 3, 1, 3, 1, 1, 25, 4, 0 if self.live else 3, 1],
                )[0]
            if self.live and run is not None and not names_sent:
                # Over a socket the decode times are unknown: the names come
                # right after the hello and never change, as a client does.
                kind = "strings"
                names_sent = True
            self.kinds[kind] += 1
            dgram, run, ends = getattr(self, "_k_" + kind)(pid, run)
            assert len(dgram) <= MAX_DATAGRAM and (len(dgram) > 0 or not self.live)
            out.append(dgram)
            self.datagrams += 1
            if ends:
                return out, run, True
        return out, run, False

    def _hdr(
        self,
        kind,
        count=0,
        first_seq=0,
        rsize=wire.RECORD_SIZE,
        magic=wire.MAGIC,
        version=wire.VERSION,
        drops_full=0,
        drops_disc=0,
    ):
        return _HDR(
            magic,
            version,
            kind,
            count,
            rsize,
            first_seq,
            self.rng.getrandbits(64),
            drops_full,
            drops_disc,
        )

    def _k_short(self, pid, run):
        self.expected["short_datagram"] += 1
        lo = 1 if self.live else 0
        return self.rng.randbytes(self.rng.randint(lo, wire.HEADER_SIZE - 1)), run, False

    def _k_magic(self, pid, run):
        self.expected["bad_magic"] += 1
        magic = self.rng.choice([0, 0x5354, 0x5353 ^ 0xFFFF, self.rng.getrandbits(16) | 1])
        if magic == wire.MAGIC:
            magic = 0
        tail = self.rng.randbytes(self.rng.randint(0, 200))
        return (
            _HDR(magic, *[self.rng.getrandbits(b) for b in (8, 8, 16, 16, 64, 64, 32, 32)]) + tail,
            run,
            False,
        )

    def _k_version(self, pid, run):
        # 0 was never a version; above wire.VERSION is a newer client.
        v = self.rng.choice([0, wire.VERSION + 1, 255, self.rng.randint(wire.VERSION + 1, 255)])
        self.expected["bad_version" if v == 0 else "unsupported_version"] += 1
        return self._hdr(self.rng.randint(1, 3), version=v) + self.rng.randbytes(64), run, False

    def _k_badkind(self, pid, run):
        self.expected["bad_kind"] += 1
        first_unknown = wire.DGRAM_STACKS + 1  # kinds 1..9 are defined (7, 8: version 3)
        k = self.rng.choice([0, first_unknown, 255, self.rng.randint(first_unknown, 255)])
        return self._hdr(k, count=1) + bytes(32), run, False

    def _k_nohello_rec(self, pid, run):
        self.expected["no_hello"] += 1
        c = self.rng.randint(0, 5)
        return self._hdr(wire.DGRAM_RECORDS, count=c) + self._make_records(c)[0], run, False

    def _k_nohello_bye(self, pid, run):
        self.expected["no_hello"] += 1
        return self._hdr(wire.DGRAM_BYE), run, False

    def _k_badhello(self, pid, run):
        self.expected["bad_hello"] += 1
        payload = self.rng.choice(BAD_HELLOS + [b"\xff" + self.rng.randbytes(100)])
        return self._hdr(wire.DGRAM_HELLO) + payload, run, False

    def _k_hello_seq(self, pid, run):
        self.expected["seq_out_of_range"] += 1
        seq = self.rng.randint(SEQ_LIMIT, (1 << 64) - 1)
        return self._hdr(wire.DGRAM_HELLO, first_seq=seq) + b'{"run_token": 5}', run, False

    def _k_hello(self, pid, run):
        rng = self.rng
        info = {f: rng.choice(WEIRD) for f in rng.sample(HELLO_FIELDS, rng.randint(0, 6))}
        resume = None
        if not self.live and self.by_token and rng.random() < 0.2:
            # a token this or another pid used (another pid's must make a new run)
            token, _ = rng.choice(list(self.by_token))
            rng.random()  # kept so that a seed makes the same inputs as before
            info["run_token"] = token
            resume = self.by_token.get((token, pid))
        elif rng.random() < 0.15:
            pass  # no token: always a new run
        else:
            info["run_token"] = rng.choice([0, rng.getrandbits(63) or 1])
        token = info.get("run_token", 0)
        first_seq = 0 if rng.random() < 0.7 else rng.randint(1, 5000)
        data = (
            self._hdr(wire.DGRAM_HELLO, first_seq=first_seq)
            + json.dumps(info).encode()[: wire.HELLO_MAX]
        )
        if resume is not None:
            run = resume
            if first_seq > run.expected:
                run.lost += first_seq - run.expected
                run.expected = first_seq
            run.names_len = 1
            run.connections += 1
        else:
            run = ModelRun(self.next_run_id, token, pid, first_seq)
            self.next_run_id += 1
            self.runs.append(run)
            if token:
                self.by_token[(token, pid)] = run
        return data, run, False

    def _k_duphello(self, pid, run):
        self.expected["duplicate_hello"] += 1
        return self._hdr(wire.DGRAM_HELLO) + b'{"run_token": 9}', run, False

    def _k_rsize(self, pid, run):
        self.expected["bad_record_size"] += 1
        rs = self.rng.choice([0, 16, 31, 33, 64, 65535])
        c = self.rng.randint(1, 4)
        return (
            self._hdr(wire.DGRAM_RECORDS, count=c, first_seq=run.expected, rsize=rs)
            + bytes(32 * c),
            run,
            False,
        )

    def _k_lenlie(self, pid, run):
        self.expected["length_mismatch"] += 1
        c = self.rng.randint(1, 127)
        actual = self.rng.choice([c - 1, c + 1, 0, self.rng.randint(0, 127)])
        if actual == c:
            actual = c + 1
        body = self._make_records(actual)[0] + (
            b"\x01" * self.rng.randint(1, 31) if self.rng.random() < 0.3 else b""
        )
        if len(body) == 32 * c:
            body += b"\x00"
        return self._hdr(wire.DGRAM_RECORDS, count=c, first_seq=run.expected) + body, run, False

    def _k_huge(self, pid, run):
        self.expected["length_mismatch"] += 1
        c = self.rng.choice([0xFFFF, 0x8000, 4096, 512])
        return (
            self._hdr(wire.DGRAM_RECORDS, count=c, first_seq=run.expected)
            + self._make_records(self.rng.randint(1, 127))[0],
            run,
            False,
        )

    def _k_regress(self, pid, run):
        c = self.rng.randint(1, 20)
        body, _ = self._make_records(c)
        if run.expected == 0:
            return self._records_dgram(pid, run, gap=0)
        self.expected["seq_regress"] += 1
        seq = self.rng.randint(0, run.expected - 1)
        return self._hdr(wire.DGRAM_RECORDS, count=c, first_seq=seq) + body, run, False

    def _k_seqrange(self, pid, run):
        self.expected["seq_out_of_range"] += 1
        c = self.rng.randint(1, 20)
        seq = self.rng.randint(SEQ_LIMIT, (1 << 64) - 1)
        return (
            self._hdr(wire.DGRAM_RECORDS, count=c, first_seq=seq) + self._make_records(c)[0],
            run,
            False,
        )

    def _k_empty(self, pid, run):
        return (
            self._hdr(wire.DGRAM_RECORDS, count=0, first_seq=self.rng.getrandbits(64)),
            run,
            False,
        )

    def _make_records(self, c, strings_ok=False):
        """c random records; returns (bytes, list of (type, a, b, c, d)).
        getrandbits, not randint: this is the fuzzer's hot loop."""
        bits = self.rng.getrandbits
        rnd = self.rng.random
        recs = []
        parts = []
        for _ in range(c):
            r = rnd()
            if r < 0.55:
                start = (1 << 40) + bits(61)
                end = start + bits(20) if rnd() < 0.9 else start - 1 - bits(20)
                kid = bits(4) if rnd() < 0.95 else bits(16)
                sid = bits(4) if rnd() < 0.95 else bits(32)
                parts.append(_REC(wire.REC_SPAN, bits(8), kid, bits(32), start, end, sid, bits(32)))
                recs.append((wire.REC_SPAN, start, end, kid, sid))
            elif r < 0.8:
                gen = bits(2) if rnd() < 0.9 else 3 + bits(7)
                start = (1 << 40) + bits(61)
                end = start + bits(20) if rnd() < 0.9 else start - 1 - bits(20)
                parts.append(_REC(wire.REC_GC, gen, 0, bits(32), start, end, bits(32), bits(32)))
                recs.append((wire.REC_GC, start, end, gen, 0))
            elif r < 0.88 and strings_ok:
                sid = bits(5) if rnd() < 0.995 else bits(16)
                parts.append(_STR(wire.REC_STRING, 0, sid, 0, b"name%d" % sid))
                recs.append((wire.REC_STRING, sid, 0, 0, 0))
            else:
                t = (0, 6, 200, 255)[bits(2)]  # 4 and 5 are version 2's SPAN_EXT, COUNTERS
                parts.append(bytes([t]) + bytes(31))
                recs.append((t, 0, 0, 0, 0))
        return b"".join(parts), recs

    def _records_dgram(self, pid, run, gap):
        # Mostly short datagrams (more datagrams per second of fuzzing), some full.
        c = (
            1 + self.rng.getrandbits(3)
            if self.rng.random() < 0.85
            else self.rng.randint(1, wire.MAX_RECORDS)
        )
        body, recs = self._make_records(c, strings_ok=not self.live)
        first_seq = run.expected + gap
        self._apply(run, first_seq, recs)
        df, dd = self.rng.getrandbits(32), self.rng.getrandbits(32)
        return (
            self._hdr(
                wire.DGRAM_RECORDS, count=c, first_seq=first_seq, drops_full=df, drops_disc=dd
            )
            + body,
            run,
            False,
        )

    def _apply(self, run, first_seq, recs):
        if first_seq > run.expected:
            run.lost += first_seq - run.expected
            run.expected = first_seq
        n_seq = 0
        for t, a, b, c, d in recs:
            if t == wire.REC_STRING:
                if a:
                    run.names_len = max(run.names_len, a + 1)
                continue
            n_seq += 1
            if t == wire.REC_SPAN:
                if b >= a:
                    run.stored += 1
                    run.pending.append((c, d))
                else:
                    self.expected["span_end_before_start"] += 1
            elif t == wire.REC_GC:
                if c <= 2 and b >= a:
                    run.stored += 1
                else:
                    self.expected["bad_gc_record"] += 1
            else:
                self.expected["unknown_record_type"] += 1
        run.expected += n_seq

    def _k_records(self, pid, run):
        return self._records_dgram(pid, run, gap=0)

    def _k_gap(self, pid, run):
        return self._records_dgram(pid, run, gap=self.rng.randint(1, 1000))

    def _k_strings(self, pid, run):
        rng = self.rng
        c = rng.randint(1, 40)
        parts, recs = [], []
        for i in range(c):
            sid = i + 1 if self.live else rng.randint(0, 60)
            parts.append(_STR(wire.REC_STRING, 0, sid, 0, rng.randbytes(rng.randint(0, 24))))
            recs.append((wire.REC_STRING, sid, 0, 0, 0))
        self._apply(run, run.expected, recs)
        return (
            self._hdr(wire.DGRAM_RECORDS, count=c, first_seq=run.expected) + b"".join(parts),
            run,
            False,
        )

    def _k_bye(self, pid, run):
        gap = 0 if self.rng.random() < 0.6 else self.rng.randint(1, 100)
        first_seq = run.expected + gap
        run.lost += gap
        run.expected = first_seq
        return self._hdr(wire.DGRAM_BYE, first_seq=first_seq), run, True

    # ----- totals ------------------------------------------------------------------
    def totals(self):
        return {
            "stored": sum(r.stored for r in self.runs),
            "lost": sum(r.lost for r in self.runs),
            "made": sum(r.expected for r in self.runs),
        }
