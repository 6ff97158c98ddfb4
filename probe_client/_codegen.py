"""Source generation of `attach()`'s wrappers: the template and its compilation.

Given a `Plan` and its `Shape` (from `_wrap.py`) and the compiled tag
expressions (from `_expr.py`), this module writes the wrapper's source,
compiles it once at attach time and dresses the result like the original
(name, qualname, signature, docstring). The generated code is the hot path:
between its two timestamps there is nothing but the user's call, and after
them only plain reads, one record write (Python: under the buffer lock;
with `_accel.c` built: one C call that writes when no thread holds the
lock and otherwise declines to the Python write) and guarded
bookkeeping; it allocates no tracked object, holds nothing strongly that
would make a cycle, and never raises into the caller. Never on the hot path
itself: this module only runs in `attach()`.
"""

import inspect
import types

from . import _expr
from ._wrap import _prefix_for, resolver, shape_for

# The factory both wrapper templates share: what build() hands each wrapper.
_MAKE = """\
def {p}make({p}p, {p}target, {p}owner, {p}self, {p}kid, {p}true_name, {p}sid, {p}pack,
             {p}buf, {p}acquire, {p}release, {p}mono, {p}local, {p}int, {p}bool, {p}len,
             {p}AttributeError, {p}Exception, {p}ids_get, {p}rec, {p}enter, {p}leave,
             {p}request{defaults}):
"""

# Everything between the two timestamps is the user's call; everything after
# is the tags and one record write, each guarded so that nothing of ours can
# replace the call's own return value or exception. `{p}` is a prefix no
# parameter name starts with, so the method's own names are free to use.
_TEMPLATE = """
{make}    {async_}def {p}wrapper({params}):
{state}        {p}result = None
{ok_init}{start}        try:
            {p}result = {await_}{p}target({call})
{ok_set}            return {p}result
        finally:
{finish}{requests}    return {p}wrapper
"""

# A request form (kind "request"): no span, only the request events of a
# call that returned.
_REQUEST_ONLY = """
{make}    {async_}def {p}wrapper({params}):
        {p}result = None
        {p}ok = False
        {p}t0 = {p}mono()
        try:
            {p}result = {await_}{p}target({call})
            {p}ok = True
            return {p}result
        finally:
{requests}    return {p}wrapper
"""

# The request events of a call that returned (probe.request never raises;
# the expressions may): the event, at the call's start (an arrival is when
# the engine was handed the request, however long the call then waited for
# the GIL), then, if `request_then` names one, a second event of the same
# request now (a token that finished it).
_REQUEST = """\
            if {p}ok:
                try:
                    {p}ev = {event}
                    if {p}ev:
                        {p}rid = {rid}
                        {p}request({p}rid, {p}ev, {tokens}, {p}t0)
{then}                except {p}Exception:
                    {p}p.errors += 1
"""

_REQUEST_THEN = """\
                        {p}ev = {then}
                        if {p}ev:
                            {p}request({p}rid, {p}ev)
"""

# attach() keywords of the request form (docs/run.md)
REQUEST_KEYS = ("request", "request_id", "request_tokens", "request_then")

# The thread's state, looked up (and made on its first span) in Python.
_STATE = """\
        try:
            {p}st = {p}local.st
        except {p}AttributeError:
            {p}st = {p}p._thread_state()
"""

# The start and the end of a span: t0, the call, t1, the depth, the tags, the write.
_START = """\
{enter}        {p}t0 = {p}mono()
"""

_FINISH = """\
            {p}t1 = {p}mono()
{state_late}{leave}            try:
{tags}
{write}            except {p}Exception:
                {p}p.errors += 1
"""

# C path, a synchronous wrapper: enter() finds the thread's state, raises
# its depth and reads t0; without tags, leave() reads t1, lowers the depth
# and writes, so the wrapper never looks the state up itself.
_START_C = """\
        {p}t0 = {p}enter()
"""

_FINISH_C = """\
            try:
                {p}r = {p}leave({p}t0)
                if {p}r:
                    if {p}r == 1:
                        {p}p._flush({p}mono())
                    else:
                        {p}p._write_declined({p}local, {p}kid, {p}t0)
            except {p}Exception:
                {p}p.errors += 1
"""

# The record write, Python path: under the buffer lock, struct.pack_into.
_WRITE_PY = """\
                {p}acquire()
                try:
                    {p}pos = {p}p._pos
                    if {p}pos >= {full}:
                        {p}p._send_full_locked({p}t1)
                        {p}pos = {p}p._pos
                    {p}pack({p}buf, {p}pos, {rtype}, {p}st.depth, {p}kid, {p}st.tid, {p}t0, {p}t1,
                           {p}st.stage_id, {p}st.batch)
                    if {p}st.ext:
                        {p}p._put_ext_locked({p}pos + {rs}, {p}st.work, {p}st.idle)
                    else:
                        {p}p._pos = {p}pos + {rs}
                finally:
                    {p}release()
                if {p}st.depth == 0:
                    {p}st.stage_id = 0
                    {p}st.batch = 0
                    if {p}st.ext:
                        {p}st.ext = 0
                        {p}st.work = None
                        {p}st.idle = None
                    if {p}t1 - {p}p._last_send_ns >= {interval} or {p}p._pos >= {half}:
                        {p}p._flush({p}t1)
"""

# The record write, C path (`_accel.c`): one call that writes the records and
# does the outermost bookkeeping; it answers 1 when a flush is due and 2 when
# it left everything to the Python path (lock held, buffer full, odd values).
_WRITE_C = """\
                {p}r = {p}rec({p}st, {p}t0, {p}t1)
                if {p}r:
                    if {p}r == 1:
                        {p}p._flush({p}t1)
                    else:
                        {p}p._write_span({p}st, {p}kid, {p}t0, {p}t1)
"""

_TAG = """\
                try:
                    {p}v = {expr}
{body}                except {p}Exception:
                    {p}p.errors += 1
"""

_TAG_BODIES = {
    "stage": (
        "                    {p}st.stage_id = ({p}sid({p}true_name) if {p}v is True else 0 if "
        "({p}v is False or {p}v is None) else {p}ids_get({p}v) or {p}sid({p}v))\n"
    ),
    "batch": (
        "                    if {p}v is not None:\n"
        "                        {p}st.batch = {p}int({p}v) & 0xFFFFFFFF\n"
    ),
    "work": (
        "                    if {p}v is not None:\n"
        "                        {p}v = {p}int({p}v)\n"
        "                        if -0x8000000000000000 <= {p}v <= 0x7FFFFFFFFFFFFFFF:\n"
        "                            {p}st.work = {p}v\n"
        "                            {p}st.ext = 1\n"
    ),
    "idle": (
        "                    if {p}v is not None:\n"
        "                        {p}st.idle = {p}bool({p}v)\n"
        "                        {p}st.ext = 1\n"
    ),
}


def _request_block(exprs, resolve, prefix):
    """The request events' source for `exprs` ('' without a request form)."""
    if exprs.get("request") is None:
        if any(exprs.get(k) is not None for k in REQUEST_KEYS):
            raise _expr.ExprError("request_id, request_tokens and request_then need request=EVENT")
        return ""
    if exprs.get("request_id") is None:
        raise _expr.ExprError("request=EVENT needs request_id=EXPR (the request's id)")

    def code(key):
        return _expr.compile_expr(exprs[key], resolve, len_name=prefix + "len")

    then = ""
    if exprs.get("request_then") is not None:
        then = _REQUEST_THEN.format(p=prefix, then=code("request_then"))
    tokens = code("request_tokens") if exprs.get("request_tokens") is not None else "None"
    return _REQUEST.format(
        p=prefix, event=code("request"), rid=code("request_id"), tokens=tokens, then=then
    )


def build(probe, plan, kid, exprs, consts, request_only=False):
    """The wrapper for `plan`; `exprs` maps 'stage'/'batch'/'work'/'idle'
    and the request form's keys (REQUEST_KEYS) to an expression (or None);
    `consts` holds the record layout numbers. `request_only`: no span, the
    request events alone."""
    prefix = _prefix_for(
        plan.target if not isinstance(plan.target, types.MethodType) else plan.target.__func__
    )
    shape = shape_for(plan, prefix)
    resolve = resolver(shape, prefix)
    requests = _request_block(exprs, resolve, prefix)
    if request_only and not requests:
        raise _expr.ExprError("kind 'request' needs request=EVENT and request_id=EXPR")
    tags = []
    true_name = ""
    for field in ("stage", "batch", "work", "idle"):
        if request_only and exprs.get(field) is not None:
            raise _expr.ExprError(f"kind 'request' records no span: {field} has nowhere to go")
        text = exprs.get(field)
        if text is None:
            continue
        code = _expr.compile_expr(text, resolve, len_name=prefix + "len")
        if field == "stage":
            true_name = _expr.last_name(text)
        body = _TAG_BODIES[field].format(p=prefix)
        tags.append(_TAG.format(p=prefix, expr=code, body=body))
    is_async = inspect.iscoroutinefunction(plan.target)
    call = shape.call_src
    if plan.mode == "weak":
        call = f"{prefix}owner(), {call}" if call else f"{prefix}owner()"
    defaults = "".join(f", {name}" for name in shape.defaults)
    accel = probe._accel is not None
    parts = {
        "p": prefix,
        # An async span does not nest: other tasks run on this thread while
        # it awaits, so it neither raises the thread's depth nor expects it.
        "enter": "" if is_async else f"        {prefix}st.depth += 1\n",
        "leave": "" if is_async else f"            {prefix}st.depth -= 1\n",
        "tags": "".join(tags) or "                pass",
        "write": (_WRITE_C if accel else _WRITE_PY).format(p=prefix, **consts),
    }
    c_start = accel and not is_async
    c_finish = c_start and not tags
    # With enter() the state is looked up after the call, for the tags only.
    parts["state_late"] = (
        _STATE.format(p=prefix)
        .replace("\n        ", "\n            ")
        .replace("        try", "            try", 1)
        if c_start and not c_finish
        else ""
    )
    start = _START_C if c_start else _START
    finish = _FINISH_C if c_finish else _FINISH
    source = (_REQUEST_ONLY if request_only else _TEMPLATE).format(
        make=_MAKE.format(p=prefix, defaults=defaults),
        p=prefix,
        defaults=defaults,
        async_="async " if is_async else "",
        await_="await " if is_async else "",
        params=shape.params_src,
        call=call,
        state="" if c_start else _STATE.format(p=prefix),
        start=start.format(**parts),
        finish=finish.format(**parts),
        ok_init=f"        {prefix}ok = False\n" if requests else "",
        ok_set=f"            {prefix}ok = True\n" if requests else "",
        requests=requests,
    )
    namespace = {}
    exec(compile(source, f"<stallscope wrapper kind={kid}>", "exec"), namespace)
    wrapper = namespace[prefix + "make"](
        probe,
        plan.target,
        plan.owner_ref,
        plan.bound_self,
        kid,
        true_name,
        probe._sid,
        consts["pack"],
        probe._buf,
        probe._lock.acquire,
        probe._lock.release,
        consts["mono"],
        probe._local,
        int,
        bool,
        len,
        AttributeError,
        Exception,
        probe._ids.get,  # a known stage's id without a method call; ids are >= 1
        *(_c_calls(probe, kid, consts) if not request_only else (None, None, None)),
        probe.request,
        *shape.defaults.values(),
    )
    # An instance's wrapper must not hold the bound method (a cycle through
    # the instance): it shows the function it calls.
    _dress(wrapper, plan.shown, plan.target if plan.mode == "weak" else plan.shown)
    return wrapper


def _c_calls(probe, kid, consts):
    """rec, enter and leave of one wrapper's `_accel.Writer` (Nones on the
    Python path). The writer holds the probe's attribute dict, buffer and lock."""
    if probe._accel is None:
        return None, None, None
    writer = probe._accel.Writer(
        vars(probe),
        probe._buf,
        probe._lock.locked,
        probe._local,
        probe._thread_state,
        kid,
        consts["full"],
        consts["half"],
        consts["interval"],
    )
    return writer.rec, writer.enter, writer.leave


def _dress(wrapper, shown, wrapped):
    """Make the wrapper look like the original to inspect and to callers'
    error messages (the code object's name is what TypeError quotes)."""
    code = getattr(shown, "__code__", None)
    if code is None and isinstance(shown, types.MethodType):
        code = getattr(shown.__func__, "__code__", None)
    if code is not None:
        names = {"co_name": code.co_name}
        if hasattr(code, "co_qualname"):  # Python >= 3.11
            names["co_qualname"] = code.co_qualname
        wrapper.__code__ = wrapper.__code__.replace(**names)
    for attr in ("__module__", "__doc__", "__name__", "__qualname__"):
        try:
            setattr(wrapper, attr, getattr(shown, attr))
        except (AttributeError, TypeError):
            pass
    try:
        wrapper.__dict__.update(getattr(wrapped, "__dict__", {}))
    except (AttributeError, TypeError):
        pass
    for attr in ("cache_info", "cache_clear", "cache_parameters"):  # functools.lru_cache
        if hasattr(wrapped, attr):
            setattr(wrapper, attr, getattr(wrapped, attr))
    try:
        wrapper.__signature__ = inspect.signature(shown)
    except (TypeError, ValueError):
        pass  # none to show: inspect follows __wrapped__ and finds none either
    wrapper.__wrapped__ = wrapped
