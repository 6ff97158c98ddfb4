"""attach() on every signature shape: the wrapper accepts and refuses exactly
what the original does, returns the same objects, raises the same errors.

Each case defines a class with one method of a given shape and a list of
calls (positional, by keyword, mixed, defaults omitted, and wrong ones). The
same call is made on the unwrapped method and on the wrapped one (attached
on the class, and on an instance), and the outcomes are compared: the value
returned (identity for default objects, equality for the fresh *args tuple
and **kwargs dict) or the exception's class and message. Shapes that cannot
be wrapped safely are refused at attach() with a reason.
"""

import asyncio
import functools
import inspect
import math

import pytest

import probe_client
from probe_client import AttachError

pytestmark = pytest.mark.daemon

LIST = [1]  # mutable defaults: the method must receive these very objects
DICT = {"k": 1}


def _outcome(fn, args, kwargs, is_async=False):
    try:
        value = fn(*args, **kwargs)
        if is_async:
            value = asyncio.run(value)
        return ("ok", value)
    except Exception as exc:  # compared below, class and message
        return ("raised", type(exc), str(exc))


def _same(a, b, bound=False):
    if a[0] != b[0]:
        return False
    if a[0] == "raised":
        if (bound is True and "positional argument" in a[2]) or bound == "loose":
            # An instance's wrapper is not a bound method (that would hold the
            # instance: a cycle), so a count of positional arguments in the
            # message leaves self out; the class and the rest are the same.
            return a[1] is b[1]
        return a[1] is b[1] and a[2] == b[2]
    x, y = a[1], b[1]
    if isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y):
        return all(
            u is v or (type(u) in (tuple, dict) and type(v) is type(u) and u == v)
            for u, v in zip(x, y, strict=True)
        )
    return x is y or x == y


A, B = object(), [2]  # arguments passed by the calls


def make_positional():
    class C:
        def m(self, bp, bootstrapping):
            return (bp, bootstrapping)

    return C


def make_defaults():
    class C:
        def m(self, a, b=LIST, c=None):
            return (a, b, c)

    return C


def make_kwonly():
    class C:
        def m(self, a, *, k, j=DICT):
            return (a, k, j)

    return C


def make_posonly():
    class C:
        def m(self, a, b=LIST, /, c=0):
            return (a, b, c)

    return C


def make_varargs():
    class C:
        def m(self, a, *args, **kw):
            return (a, args, kw)

    return C


def make_only_star():
    class C:
        def m(*args, **kw):
            return (args[1:], kw)

    return C


def make_static():
    class C:
        @staticmethod
        def m(a, b=LIST):
            return (a, b)

    return C


def make_classmethod():
    class C:
        @classmethod
        def m(cls, a, *, k=DICT):
            return (cls, a, k)

    return C


def make_lru():
    class C:
        @functools.lru_cache(maxsize=64)  # noqa: B019 (the shape under test)
        def m(self, a, b=2):
            return (a, b)

    return C


def make_partialmethod():
    class C:
        def full(self, x, a, b=LIST):
            return (x, a, b)

        m = functools.partialmethod(full, A)

    return C


def make_builtin():
    class C:
        m = math.hypot  # builtins do not bind: C().m(3, 4) is hypot(3, 4)

    return C


def make_method_descriptor():
    class C(list):
        m = list.index

    return C


def make_async():
    class C:
        async def m(self, a, b=LIST, *, k=0):
            await asyncio.sleep(0)
            return (a, b, k)

    return C


COMMON_WRONG = [((), {"nope": 1}), ((A, B, A, B, A), {})]

CASES = {
    "positional": (
        make_positional,
        [((A, B), {}), ((A,), {"bootstrapping": True}), ((), {"bp": A, "bootstrapping": B})]
        + [((), {}), ((A,), {}), ((A, B), {"bp": A}), ((A,), {"bootstrapping": 1, "x": 2})],
    ),
    "defaults": (
        make_defaults,
        [((A,), {}), ((A, B), {}), ((A,), {"c": B}), ((), {"a": A}), ((A,), {"b": B, "c": A})]
        + [((), {}), ((A, B, A, B), {}), ((), {"b": B})],
    ),
    "kwonly": (
        make_kwonly,
        [((A,), {"k": B}), ((), {"a": A, "k": B, "j": A})]
        + [((A, B), {}), ((A,), {}), ((A,), {"k": B, "z": 1})],
    ),
    "posonly": (
        make_posonly,
        [((A,), {}), ((A, B), {}), ((A, B, A), {}), ((A,), {"c": B})]
        + [((), {"a": A}), ((A,), {"b": B})],
    ),
    "varargs": (
        make_varargs,
        [((A,), {}), ((A, B, A), {}), ((A,), {"x": B}), ((), {"a": A, "x": B})]
        + [((), {}), ((A,), {"a": B})],
    ),
    "only_star": (make_only_star, [((), {}), ((A, B), {"x": A})]),
    "staticmethod": (
        make_static,
        [((A,), {}), ((A, B), {}), ((), {"a": A, "b": B})] + [((), {}), ((A,), {"c": 1})],
    ),
    "classmethod": (
        make_classmethod,
        [((A,), {}), ((), {"a": A, "k": B})] + [((), {}), ((A, B), {})],
    ),
    "lru_cache": (make_lru, [((1,), {}), ((1, 3), {}), ((), {"a": 5})] + [((), {})]),
    "partialmethod": (
        make_partialmethod,
        [((A,), {}), ((A, B), {}), ((), {"a": A, "b": B})] + [((), {}), ((A,), {"x": 1})],
    ),
    "builtin": (make_builtin, [((3, 4), {}), ((), {}), (("x",), {}), ((1,), {"k": 2})]),
    "method_descriptor": (make_method_descriptor, [((0,), {}), ((7,), {}), ((), {})]),
    "async": (
        make_async,
        [((A,), {}), ((A, B), {}), ((), {"a": A, "k": B}), ((A,), {"b": B, "k": 1})]
        + [((), {}), ((A,), {"z": 1})],
    ),
}


def _instance(cls):
    obj = cls()
    if isinstance(obj, list):
        obj.extend([0, 5])  # for list.index
    return obj


@pytest.fixture
def probe(tmp_path):
    p = probe_client.connect(socket_path=str(tmp_path / "absent.sock"), gc=False)
    yield p
    p.close()


@pytest.mark.parametrize("where", ["class", "instance"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_wrapper_behaves_exactly_like_the_method(probe, case, where):
    make, calls = CASES[case]
    calls = calls + COMMON_WRONG
    cls = make()
    is_async = case == "async"
    obj = _instance(cls)
    shown = inspect.signature(obj.m) if case != "builtin" else None
    shown_cls = inspect.signature(cls.m) if case != "builtin" else None
    before = {i: _outcome(obj.m, a, k, is_async) for i, (a, k) in enumerate(calls)}
    before_cls = {}
    if case in ("staticmethod", "classmethod", "builtin"):
        before_cls = {i: _outcome(cls.m, a, k, is_async) for i, (a, k) in enumerate(calls)}
    if case == "lru_cache":
        cls.m.cache_clear()
    seq0 = probe.stats()["next_seq"]
    probe.attach(cls if where == "class" else obj, "m", kind="k")
    assert cls.__dict__["m"] is not None
    after = {i: _outcome(obj.m, a, k, is_async) for i, (a, k) in enumerate(calls)}
    for i, (a, k) in enumerate(calls):
        # C callables word their messages by the type they were reached
        # through: the class of the error is what they share.
        bound = "loose" if case in ("builtin", "method_descriptor") else where == "instance"
        assert _same(before[i], after[i], bound), (case, where, a, k, before[i], after[i])
    if where == "class":
        for i, (a, k) in enumerate(calls):
            if i in before_cls:
                got = _outcome(cls.m, a, k, is_async)
                assert _same(before_cls[i], got), (case, a, k, before_cls[i], got)
    if shown is not None:
        assert inspect.signature(obj.m) == shown
        assert inspect.signature(cls.m) == shown_cls
    if is_async:
        assert inspect.iscoroutinefunction(obj.m)
    if case == "lru_cache":
        assert cls.m.cache_info().currsize >= 1  # the cache behind the wrapper served
    ok_calls = sum(1 for o in after.values() if o[0] == "ok")
    assert ok_calls > 0
    # Every call that reached the method was timed (calls refused while
    # binding the arguments never entered the wrapper's body, as with the
    # original they never entered the method's).
    assert probe.stats()["next_seq"] - seq0 >= ok_calls
    assert probe.errors == 0


def test_keyword_call_of_the_issue_case(probe):
    """HF ContinuousBatchingManager._generation_loop_body(self, batch_processor,
    bootstrapping), called with bootstrapping=True."""

    class Manager:
        def _generation_loop_body(self, batch_processor, bootstrapping):
            return (batch_processor, bootstrapping)

    m = Manager()
    probe.attach(Manager, "_generation_loop_body", kind="step", batch="arg1")
    assert m._generation_loop_body(7, bootstrapping=True) == (7, True)
    probe.attach(m, "_generation_loop_body", kind="body", stage="arg0")
    assert m._generation_loop_body(batch_processor=7, bootstrapping=False) == (7, False)
    assert probe.errors == 0


def test_parameter_names_that_clash_with_ours_work(probe):
    class C:
        def m(self, result, st=1, _ss_p=2, len=3, int=4, Exception=5):
            return (result, st, _ss_p, len, int, Exception)

    probe.attach(C, "m", kind="k", batch="len", stage="result")
    assert C().m(0, st=9, len=7) == (0, 9, 2, 7, 4, 5)
    assert probe.errors == 0


def _gen():
    yield 1


async def _agen():
    yield 1


@pytest.mark.parametrize(
    "define, why",
    [
        (lambda: type("C", (), {"m": lambda self: _gen()}), None),  # a function returning one: fine
        (lambda: type("C", (), {"m": _gen}), "generator function"),
        (lambda: type("C", (), {"m": _agen}), "async generator function"),
        (lambda: type("C", (), {"m": property(lambda self: 1)}), "property"),
        (
            lambda: type("C", (), {"m": functools.cached_property(lambda self: 1)}),
            "cached_property",
        ),
        (
            lambda: type("C", (), {"m": functools.singledispatchmethod(lambda self, x: x)}),
            "cannot reproduce",
        ),
        (lambda: type("C", (), {"m": 3}), "not callable"),
    ],
)
def test_unsafe_shapes_are_refused_at_attach_with_a_reason(probe, define, why):
    cls = define()
    if why is None:
        probe.attach(cls, "m", kind="k")
        assert next(cls().m()) == 1
        return
    with pytest.raises(AttachError, match=why):
        probe.attach(cls, "m", kind="k")
    assert cls.__dict__["m"] is not None  # untouched
    if why not in ("property", "cached_property"):
        # On an instance, what the lookup returns is wrapped, unless holding
        # it would be a cycle (a singledispatchmethod's closure holds self).
        with pytest.raises(AttachError, match=f"{why}|cycle"):
            probe.attach(cls(), "m", kind="k")


def test_instance_attach_of_a_cached_property_does_not_compute_it(probe):
    calls = []

    class C:
        @functools.cached_property
        def m(self):
            calls.append(1)
            return len

    with pytest.raises(AttachError, match="cached_property"):
        probe.attach(C(), "m", kind="k")
    assert calls == []


def test_async_span_covers_the_awaited_call(tmp_path):
    from helpers.daemonproc import DaemonProcess

    d = DaemonProcess(tmp_path).start()
    p = probe_client.connect(socket_path=d.socket, gc=False)
    marks = {}

    class C:
        async def m(self, n):
            marks["entered"] = probe_client._probe._monotonic_ns()
            for _ in range(n):
                await asyncio.sleep(0.001)
            marks["resumed"] = probe_client._probe._monotonic_ns()
            return n

    p.attach(C, "m", kind="async_step", batch="arg0")

    async def main():
        coro = C().m(3)
        marks["created"] = probe_client._probe._monotonic_ns()
        await asyncio.sleep(0.002)  # the span starts when awaited, not at creation
        return await coro

    assert asyncio.run(main()) == 3
    p.close()
    d.stop()
    ((start, end, batch),) = d.query("SELECT start_ns, end_ns, batch FROM spans")
    assert marks["created"] < start <= marks["entered"]
    assert end >= marks["resumed"]
    assert batch == 3


def test_detach_restores_every_shape(tmp_path):
    p = probe_client.connect(socket_path=str(tmp_path / "absent.sock"), gc=False)
    classes = {name: make() for name, (make, _) in CASES.items()}
    raw = {name: cls.__dict__["m"] for name, cls in classes.items()}
    for cls in classes.values():
        p.attach(cls, "m", kind="k")
    p.close()
    for name, cls in classes.items():
        assert cls.__dict__["m"] is raw[name], name


def test_callable_already_stored_on_the_instance_is_wrapped(probe):
    """A hook the program stored on the instance (it refers back to the
    instance: the cycle is the program's) is wrapped, not refused."""

    class Engine:
        def _step(self, n=1):
            return n

    class Injector:
        def __init__(self, engine):
            self.orig = engine._step
            engine._step = self.step

        def step(self, n=1):
            return self.orig(n) + 1

    e = Engine()
    Injector(e)
    probe.attach(e, "_step", kind="step")
    assert e._step() == 2 and e._step(n=5) == 6
    assert probe.errors == 0
