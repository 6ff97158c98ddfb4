"""The stage/batch/work/idle expression language and wire version 2.

Expressions compile, at attach time, to code that computes exactly what
Python computes for the same text on the same objects; anything outside the
language is refused at attach() with the reason. work= and idle= land in
spans.work / spans.idle (version-2 SPAN_EXT records); a version-1 client is
still accepted (its spans have NULL work and idle); a newer version is
refused as `unsupported_version` in ingest_errors.
"""

import json
import socket
import types

import pytest

import probe_client
from probe_client import ExprError, _expr, wire

pytestmark = pytest.mark.daemon


def _ns():
    batch = types.SimpleNamespace(
        max_length_q=3,
        items=[types.SimpleNamespace(x=1), types.SimpleNamespace(x=7)],
        requests=("a", "b"),
        table={"k": 5, "n": None},
        is_prefill=True,
        empty=[],
    )
    return {"result": ([1, 2, 3], "x"), "self": types.SimpleNamespace(b=batch), "arg0": batch}


GOOD = [
    "len(result[0])",
    "result[0][-1]",
    "arg0.items[-1].x",
    "arg0.items[0].x + arg0.items[1].x * 2",
    '"prefill" if arg0.max_length_q > 1 else "decode"',
    '"prefill" if arg0.max_length_q > 5 else "decode"',
    "arg0.max_length_q > 1",
    "1 < arg0.max_length_q <= 3",
    "arg0.is_prefill",
    "not arg0.empty",
    "len(arg0.empty) == 0 or arg0.max_length_q // 2",
    "arg0.table['k']",
    "arg0.table['n'] is None",
    "result[1] in ('x', 'y')",
    "result[1] not in ('x', 'y')",
    "-arg0.max_length_q",
    "self.b.requests[0]",
    "arg0.max_length_q % 2 == 1 and len(self.b.requests)",
    "None",
    "True",
]

BAD = [
    ("result.phase()", "only call allowed"),
    ("result[0:2]", "subscript"),
    ("result[arg0]", "subscript"),
    ("[1, 2]", "List"),
    ("{}", "Dict"),
    ("(1, 2)", "Tuple"),
    ("lambda: 1", "Lambda"),
    ("arg0.__dict__", "attribute"),
    ("arg0.x ** 2", "Pow"),
    ("arg0 in [1, 2]", "literal tuple"),
    ("arg0 in arg0.requests", "literal tuple"),
    ("len(arg0, arg0)", "only call allowed"),
    ("len(*arg0)", "only call allowed"),
    ("f'{arg0}'", "JoinedStr"),
    ("nope.x", "unknown name"),
    ("arg5.x", "positional argument"),
    ("result.x if", "bad expression"),
    ("", "non-empty"),
    ("(y := 1)", "NamedExpr"),
]


def _resolve(name):
    return name if name in ("result", "self", "arg0") else None


@pytest.mark.parametrize("text", GOOD)
def test_expressions_evaluate_as_python_does(text):
    code = _expr.compile_expr(text, _resolve)
    ns = _ns()
    assert eval(code, {"len": len}, ns) == eval(text, {"len": len}, _ns())


class Engine:
    def step(self, batch, bootstrapping=False):
        return [batch.requests]


@pytest.mark.parametrize("text, why", BAD)
def test_bad_expressions_are_refused_at_attach(text, why):
    p = probe_client.connect(socket_path="/nonexistent/x.sock", gc=False)
    try:
        for field in ("stage", "batch", "work", "idle"):
            with pytest.raises(ExprError, match=why):
                p.attach(Engine, "step", kind="step", **{field: text})
            assert "step" in Engine.__dict__ and not hasattr(Engine.step, "__wrapped__")
    finally:
        p.close()


def _spans(d):
    return d.query("SELECT kind, stage, batch, work, idle FROM spans ORDER BY end_ns")


def test_work_idle_stage_and_bool_values_land_in_spans(daemon):
    p = probe_client.connect(socket_path=daemon.socket, gc=False)

    class Batch:
        def __init__(self, q, n):
            self.max_length_q, self.requests, self.is_prefill = q, list(range(n)), q > 1

    class E:
        def step(self, batch, bootstrapping=False):
            return self.forward(batch)

        def forward(self, batch):
            return len(batch.requests)

    p.attach(
        E,
        "step",
        kind="step",
        stage='"prefill" if batch.max_length_q > 1 else "decode"',
        work="result * 10",
        idle="len(arg0.requests) == 0",
    )
    p.attach(E, "forward", kind="forward", batch="arg0.is_prefill")
    e = E()
    e.step(Batch(4, 3))
    e.step(Batch(1, 0), bootstrapping=True)
    p.attach(E, "forward", kind="flag", stage="arg0.is_prefill")  # bool stage
    e.forward(Batch(4, 1))
    e.forward(Batch(1, 1))
    t0 = p.begin()
    p.end("manual", t0, work=123, idle=False)
    p.end("manual_none", p.begin())
    p.close()
    assert p.errors == 0
    daemon.stop()
    # SPAN_EXT records take no sequence number: made = stored, no gap.
    assert daemon.scalar("SELECT count(*) FROM spans") == p.stats()["next_seq"] == 10
    assert daemon.scalar("SELECT count(*) FROM losses") == 0
    assert _spans(daemon) == [
        # forward's bool batch: True is 1, False is 0; the step carries it,
        # and step's own stage, work and idle label the step (and, ended
        # before them, not the inner forward span).
        ("forward", None, 1, None, None),
        ("step", "prefill", 1, 30, False),
        ("forward", None, 0, None, None),
        ("step", "decode", 0, 0, True),
        # a bool stage: True records the expression's last name, False none
        ("forward", None, 1, None, None),
        ("flag", "is_prefill", 1, None, None),
        ("forward", None, 0, None, None),
        ("flag", None, 0, None, None),
        ("manual", None, 0, 123, False),
        ("manual_none", None, 0, None, None),
    ]


def _hdr(version, kind, count=0, first_seq=0):
    return wire.HEADER.pack(wire.MAGIC, version, kind, count, 32, first_seq, 1, 0, 0)


def test_version_1_client_is_accepted_and_newer_is_refused(daemon):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(daemon.socket)
    s.send(_hdr(1, wire.DGRAM_HELLO) + json.dumps({"run_token": 11, "label": "v1"}).encode())
    names = wire.STRING_RECORD.pack(wire.REC_STRING, 0, 1, 0, b"step")
    s.send(_hdr(1, wire.DGRAM_RECORDS, 1) + names)
    recs = wire.RECORD.pack(wire.REC_SPAN, 0, 1, 7, 10, 20, 0, 4)
    # In version 1, type 4 is an unknown type: counted, and it takes a number.
    recs += wire.RECORD.pack(wire.REC_SPAN_EXT, 1, 0, 0, 99, 0, 0, 0)
    recs += wire.RECORD.pack(wire.REC_SPAN, 0, 1, 7, 30, 40, 0, 5)
    s.send(_hdr(1, wire.DGRAM_RECORDS, 3) + recs)
    s.send(_hdr(1, wire.DGRAM_BYE, first_seq=3))
    newer = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    newer.connect(daemon.socket)
    newer.send(_hdr(wire.VERSION + 1, wire.DGRAM_HELLO) + b"{}")
    v2 = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    v2.connect(daemon.socket)
    v2.send(_hdr(2, wire.DGRAM_HELLO) + json.dumps({"run_token": 12}).encode())
    v2.send(_hdr(2, wire.DGRAM_RECORDS, 1) + names)
    orphan = wire.EXT_RECORD.pack(wire.REC_SPAN_EXT, 1, 0, 0, 5, 0, 0, 0)
    v2.send(_hdr(2, wire.DGRAM_RECORDS, 2) + orphan + recs[64:])  # ext before any span
    for sock in (s, newer, v2):
        sock.close()
    probe = probe_client.connect(socket_path=daemon.socket, gc=False)
    probe.close()  # a v2 client next to them, after them (ordering)
    daemon.stop()
    assert daemon.query(
        "SELECT r.label, s.batch, s.work, s.idle FROM spans s JOIN runs r USING (run_id) "
        "ORDER BY r.label, s.batch"
    ) == [("", 5, None, None), ("v1", 4, None, None), ("v1", 5, None, None)]
    errors = dict(daemon.query("SELECT reason, sum(count) FROM ingest_errors GROUP BY ALL"))
    assert errors == {"unknown_record_type": 1, "unsupported_version": 1, "orphan_span_ext": 1}
    assert daemon.scalar("SELECT coalesce(sum(count), 0) FROM losses") == 0
