"""The attach spec language of `stallscope run`: text form, quoting rule, TOML form.

Pure parsing: what each form becomes (the keywords handed to `attach()`
unchanged), what is refused and with which reason, and that the text the
wrapper writes for a TOML entry reads back as the same spec."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from probe_client import _specs
from probe_client._specs import Spec, SpecError, format_spec, parse_spec, split_specs


def test_plain_spec():
    spec = parse_spec("engine.core:Engine._step=step")
    assert (spec.module, spec.path, spec.kind, spec.keywords) == (
        "engine.core",
        "Engine._step",
        "step",
        {},
    )
    assert not spec.optional and spec.target == "engine.core:Engine._step"


def test_keywords_pass_through_in_order_and_unchanged():
    spec = parse_spec("m:C.f=step, batch = len(arg0.requests) ,stage=result.phase,future_kw=x.y")
    assert spec.keywords == {
        "batch": "len(arg0.requests)",
        "stage": "result.phase",
        "future_kw": "x.y",  # not ours to judge: attach() decides
    }
    assert list(spec.keywords) == ["batch", "stage", "future_kw"]


def test_indexing_comparisons_and_conditionals_need_no_quotes():
    spec = parse_spec(
        "m:C.f=step,batch=len(result[0]),idle=self.n == 0,"
        'stage="prefill" if self.q[-1] > 1 else "decode",work=self.d["a,b"]'
    )
    assert spec.keywords == {
        "batch": "len(result[0])",
        "idle": "self.n == 0",
        "stage": '"prefill" if self.q[-1] > 1 else "decode"',
        "work": 'self.d["a,b"]',
    }


def test_single_quotes_quote_a_whole_expr_with_commas_and_doubled_quotes():
    spec = parse_spec("m:C.f=step,stage='''p'' if x in (1, 2) else ''d''',batch='len(a),'")
    assert spec.keywords == {"stage": "'p' if x in (1, 2) else 'd'", "batch": "len(a),"}


def test_optional_mark():
    spec = parse_spec("? m:C.f=step")
    assert spec.optional and spec.module == "m"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("m.C.f=step", "one ':'"),
        ("m:C.f", "module:Qualname.method=kind"),
        ("m:C.f=", "kind"),
        ("m:C.f=a kind", "kind"),
        ("m-x:C.f=step", "dotted name"),
        ("m:C..f=step", "Qualname.method"),
        ("m:C.f=step,batch", "KEY=EXPR"),
        ("m:C.f=step,batch=", "empty EXPR"),
        ("m:C.f=step,1x=a", "keyword name"),
        ("m:C.f=step,batch=a,batch=b", "twice"),
        ("m:C.f=step,kind=x", "part of the spec"),
        ("m:C.f=step,batch=len(a", "unclosed bracket"),
        ("m:C.f=step,batch=a)", "unbalanced"),
        ("m:C.f=step,stage='p' if x else 'd'", "closing quote"),
        ("m:C.f=step,stage='abc", "unclosed"),
    ],
)
def test_refused_with_a_reason(text, why):
    with pytest.raises(SpecError, match="bad attach spec") as err:
        parse_spec(text)
    assert why in str(err.value)
    assert repr(text.strip()) in str(err.value)  # the message quotes the spec


def test_environment_form_keeps_good_specs_next_to_bad_ones():
    specs, errors = split_specs(
        "a:B.c=step,batch=len(x[);  ; d:E.f=step,stage='x;y' ; g:H.i=sub,batch=\"j;k\""
    )
    assert [s.target for s in specs] == ["d:E.f", "g:H.i"]
    assert specs[0].keywords == {"stage": "x;y"} and specs[1].keywords == {"batch": '"j;k"'}
    assert len(errors) == 1 and "a:B.c" in errors[0]
    # An unclosed quote: cut at every ';', so only the spec that has it fails.
    specs, errors = split_specs("a:B.c=step,stage='open; d:E.f=step")
    assert [s.target for s in specs] == ["d:E.f"]
    assert len(errors) == 1 and "unclosed ' quote" in errors[0]


def test_toml_form_and_its_round_trip_through_text():
    data = {
        "description": "x",
        "attach": [
            {"target": "m:C.f", "kind": "step", "batch": "len(arg0)", "optional": True},
            {"target": "m:C.g", "kind": "schedule", "stage": "'it''s' if a, b else \"x\""},
            {"target": "m:C.h", "kind": "step", "batch": 3},
            {"target": "nocolon", "kind": "step"},
        ],
    }
    specs, errors = _specs.specs_from_toml(data, "f.toml")
    assert [s.path for s in specs] == ["C.f", "C.g"]
    assert specs[0].optional and specs[0].keywords == {"batch": "len(arg0)"}
    assert len(errors) == 2
    assert "f.toml [[attach]] #3" in errors[0] and "batch must be a non-empty string" in errors[0]
    assert "#4" in errors[1] and "one ':'" in errors[1]
    for spec in specs:
        assert parse_spec(format_spec(spec)) == spec


_EXPR_CHARS = st.sampled_from(list("abc ()[]{},;'\"=<>-0123.!"))


@given(
    st.dictionaries(
        st.sampled_from(["stage", "batch", "work", "idle", "x"]),
        st.text(_EXPR_CHARS, min_size=1).filter(lambda t: t.strip() == t and t),
    )
)
def test_any_expr_survives_the_text_form(keywords):
    # What the wrapper writes into $STALLSCOPE_ATTACH reads back exactly,
    # whatever quotes, commas, brackets or semicolons an EXPR holds.
    spec = Spec("pkg.mod", "Cls.meth", "step", keywords, optional=bool(len(keywords) % 2))
    text = format_spec(spec)
    assert parse_spec(text) == spec
    specs, errors = split_specs(f"{text};{text}")
    assert not errors and specs == [spec, spec]


def test_a_role_is_reported_when_its_target_first_runs_not_when_attached(tmp_path):
    """`role` is no attach() keyword: a one-shot shim reports it on the
    target's first call in the process, then puts the wrapper back."""
    import sys
    import types

    from probe_client import _autoattach
    from probe_client._probe import Probe

    module = types.ModuleType("rolemod")

    class Engine:
        def step(self, x):
            return x + 1

    module.Engine = Engine
    sys.modules["rolemod"] = module
    probe = Probe(socket_path=str(tmp_path / "none.sock"), gc=False)
    events = []
    probe.event = lambda kind, target, message: events.append((kind, message))
    try:
        hooks = _autoattach.Hooks(probe)
        hooks.add([parse_spec("rolemod:Engine.step=step,role='engine core',batch=arg0")])
        assert [k for k, _ in events] == ["attached"]  # imported and wrapped: no role yet
        shim = Engine.__dict__["step"]
        assert Engine().step(2) == 3
        assert events[-1] == ("role", "engine core")
        wrapper = Engine.__dict__["step"]
        assert wrapper is not shim and wrapper.__stallscope_kind__ == "step"
        assert Engine().step(4) == 5 and [k for k, _ in events].count("role") == 1
    finally:
        probe.close()
        del sys.modules["rolemod"]


def test_request_forms_record_events_and_bad_ones_are_refused_with_the_reason(tmp_path):
    """A request form (docs/run.md): `request=EVENT`, `request_id`, and
    optionally `request_tokens` and `request_then`; kind `request` records
    no span. Forms missing a part are refused when attached, saying why;
    an expression that raises at call time is counted, never raised."""
    import sys
    import types

    from probe_client import _autoattach
    from probe_client._probe import Probe

    module = types.ModuleType("reqmod")

    class Manager:
        def add(self, prompt, request_id=None):
            return request_id

    class State:
        def __init__(self, rid):
            self.request_id, self.n = rid, 0

        def update(self, token):
            self.n += 1
            return self.n == 2

    module.Manager, module.State = Manager, State
    sys.modules["reqmod"] = module
    probe = Probe(socket_path=str(tmp_path / "none.sock"), gc=False)
    events, requests = [], []
    probe.event = lambda kind, target, message: events.append((kind, target, message))
    probe.request = lambda rid, ev, tokens=None, ts_ns=None: requests.append((rid, ev, tokens))
    bad = [
        "reqmod:State.update=request,request_id=self.request_id",  # no event
        "reqmod:State.update=request",  # nothing to record
        "reqmod:State.update=request,request='token'",  # no id
        "reqmod:State.update=request,stage='x',request='token',request_id=self.request_id",
        "reqmod:State.update=update,request_then='finished',request_id=self.request_id",
    ]
    try:
        hooks = _autoattach.Hooks(probe)
        hooks.add([parse_spec(text) for text in bad])
        failed = {target: why for kind, target, why in events if kind == "attach_failed"}
        assert len(failed) == len(bad), events
        assert "request=EVENT" in failed[bad[0]] and "request=EVENT" in failed[bad[1]]
        assert "request_id" in failed[bad[2]] and "no span" in failed[bad[3]]
        assert "request=EVENT" in failed[bad[4]]
        events.clear()
        hooks.add([
            parse_spec("reqmod:Manager.add=request,request='\"arrived\" if result else None',"
                       "request_id=result,request_tokens=len(prompt)"),
            # the event is an EXPR: a string literal keeps its quotes (request='token'
            # would be the quoted EXPR `token`, the method's parameter)
            parse_spec("reqmod:State.update=request,request=\"token\",request_id=self.request_id,"
                       "request_then='\"finished\" if result else None'"),
        ])  # fmt: skip
        assert [k for k, _, _ in events] == ["attached", "attached"], events
        assert Manager().add([1, 2, 3], "r1") == "r1"
        assert Manager().add([1]) is None  # refused by the engine: nothing recorded
        state = State("r1")
        assert state.update(5) is False and state.update(6) is True
        assert requests == [("r1", "arrived", 3), ("r1", "token", None), ("r1", "token", None),
                            ("r1", "finished", None)]  # fmt: skip
        # an expression that raises (no such attribute) is counted, the call's result kept
        del state.request_id
        errors = probe.errors
        assert state.update(7) is False and probe.errors == errors + 1
    finally:
        probe.close()
        del sys.modules["reqmod"]
