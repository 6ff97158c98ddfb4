"""How `attach()` wraps a method: which callable, stored how, with which parameters.

`plan_class()` / `plan_instance()` look an attribute up without invoking
descriptors, decide what the wrapper calls (the function, the unbound C
method, the callable found) and how it is stored (plain, staticmethod,
classmethod), and refuse, with the reason, what cannot be wrapped safely:
generators, properties, descriptors with their own binding, a callable that
refers back to the instance it would be stored on (a cycle). `shape_for()`
reads a Python function's real parameters from its code object (names,
kinds, the default objects themselves) so the generated wrapper binds every
call exactly as the method does. Runs at attach time only, never on the hot
path; `_codegen.py` writes the wrapper itself.
"""

import functools
import gc
import inspect
import types
import weakref

from . import _expr

_CO_VARARGS = inspect.CO_VARARGS
_CO_VARKEYWORDS = inspect.CO_VARKEYWORDS


class AttachError(TypeError):
    """A method `attach()` cannot wrap safely; the message says why."""


class Shape:
    """The wrapper's parameter list and how it forwards them.

    `self_code`: code for the instance in the wrapper ('' when none);
    `positional`: code for the positional arguments after self, in order;
    `star`: the *args parameter's name (None: none); `params`: parameter
    names usable in expressions."""

    def __init__(self, params_src, call_src, defaults, positional, star, names, self_code):
        self.star_offset = 0  # *args items before argument 0 (self, for def m(*args))
        self.params_src = params_src
        self.call_src = call_src
        self.defaults = defaults
        self.positional = positional
        self.star = star
        self.names = names
        self.self_code = self_code


def _code_shape(func, skip_first, prefix):
    """Shape of a Python function from its code object (its real binding,
    not what a __signature__ or __wrapped__ claims)."""
    co = func.__code__
    varnames = co.co_varnames
    n_pos, n_posonly, n_kwonly = co.co_argcount, co.co_posonlyargcount, co.co_kwonlyargcount
    pos = list(varnames[:n_pos])
    kwonly = list(varnames[n_pos : n_pos + n_kwonly])
    i = n_pos + n_kwonly
    star = dstar = None
    if co.co_flags & _CO_VARARGS:
        star = varnames[i]
        i += 1
    if co.co_flags & _CO_VARKEYWORDS:
        dstar = varnames[i]
    defaults = func.__defaults__ or ()
    kwdefaults = func.__kwdefaults__ or {}
    first_default = n_pos - len(defaults)
    params, call, bound = [], [], {}
    start = 1 if (skip_first and pos) else 0
    for idx in range(start, n_pos):
        name = pos[idx]
        text = name
        if idx >= first_default:
            key = f"{prefix}d{len(bound)}"
            bound[key] = defaults[idx - first_default]
            text = f"{name}={key}"
        params.append(text)
        call.append(name)
        if idx == n_posonly - 1:
            params.append("/")
    if star:
        params.append("*" + star)
        call.append("*" + star)
    elif kwonly:
        params.append("*")
    for name in kwonly:
        if name in kwdefaults:
            key = f"{prefix}d{len(bound)}"
            bound[key] = kwdefaults[name]
            params.append(f"{name}={key}")
        else:
            params.append(name)
        call.append(f"{name}={name}")
    if dstar:
        params.append("**" + dstar)
        call.append("**" + dstar)
    after = pos[start:]
    names = set(pos[start:]) | set(kwonly) | {n for n in (star, dstar) if n}
    return Shape(", ".join(params), ", ".join(call), bound, after, star, names, "")


def _generic_shape(prefix):
    """Any callable: forward *args and **kwargs (the wrapper's own tuple and
    dict, freed when the call returns, as a *args callee's are)."""
    args, kwargs = prefix + "args", prefix + "kwargs"
    return Shape(f"*{args}, **{kwargs}", f"*{args}, **{kwargs}", {}, [], args, set(), "")


def _param_names(func):
    co = getattr(func, "__code__", None)
    return co.co_varnames[: co.co_argcount + co.co_kwonlyargcount + 2] if co else ()


def _prefix_for(func):
    """A prefix for our own names that no parameter of `func` starts with."""
    names = _param_names(func)
    prefix, n = "_ss_", 0
    while any(name.startswith(prefix) for name in names):
        n += 1
        prefix = f"_ss{n}_"
    return prefix


def _refuse_generators(func, where):
    if inspect.isasyncgenfunction(func):
        raise AttachError(
            f"{where} is an async generator function: a call only creates the generator, "
            "so its span would be empty and its iterations belong to the consumer; attach "
            "to the method that consumes it, or time iterations with probe.span()"
        )
    if inspect.isgeneratorfunction(func):
        raise AttachError(
            f"{where} is a generator function: a call only creates the generator, "
            "so its span would be empty and its iterations belong to the consumer; attach "
            "to the method that consumes it, or time iterations with probe.span()"
        )


class Plan:
    """What `attach()` installs: `target` called by the wrapper with self
    (`mode` 'class': the first parameter; 'weak': `owner_ref()`; 'call':
    none), and how the wrapper is stored (`store`: 'plain', 'static',
    'classmethod')."""

    def __init__(self, target, mode, store, shown, owner_ref=None, bound_self=None):
        self.target = target
        self.mode = mode
        self.store = store
        self.shown = shown  # what inspect.signature and __wrapped__ describe
        self.owner_ref = owner_ref
        self.bound_self = bound_self


_METHOD_LIKE = (types.MethodDescriptorType, types.WrapperDescriptorType)


def plan_class(owner, name):
    """How to wrap attribute `name` of class `owner` for every instance."""
    where = f"{owner.__name__}.{name}"
    try:
        raw = inspect.getattr_static(owner, name)
    except AttributeError:
        raise AttributeError(f"{where} does not exist") from None
    if isinstance(raw, staticmethod):
        func = raw.__func__
        _refuse_generators(func, where)
        return Plan(func, "call", "static", func)
    if isinstance(raw, classmethod):
        func = raw.__func__
        if not callable(func):
            raise AttachError(f"{where} is a classmethod over {type(func).__name__}")
        _refuse_generators(func, where)
        return Plan(func, "class", "classmethod", func)
    if isinstance(raw, (property, functools.cached_property)):
        raise AttachError(
            f"{where} is a {type(raw).__name__}: reading it is not a call; attach to the "
            "method it reads from"
        )
    if isinstance(raw, functools.partialmethod):
        func = getattr(owner, name)  # a plain function taking self first
        _refuse_generators(raw.func, where)
        return Plan(func, "class", "plain", func)
    if not callable(raw) and not hasattr(type(raw), "__get__"):
        raise AttachError(f"{where} is not callable ({type(raw).__name__})")
    if isinstance(raw, types.FunctionType):
        _refuse_generators(raw, where)
        return Plan(raw, "class", "plain", raw)
    if not hasattr(type(raw), "__get__"):
        # A builtin or callable object on a class is not bound on lookup:
        # a staticmethod wrapper keeps it unbound.
        _refuse_generators(raw, where)
        return Plan(raw, "call", "static", raw)
    if isinstance(raw, _METHOD_LIKE) or type(raw) is functools._lru_cache_wrapper:
        # These bind like functions: obj.name is a method of obj.
        _refuse_generators(raw, where)
        return Plan(raw, "class", "plain", raw)
    raise AttachError(
        f"{where} is a {type(raw).__name__}, which binds through its own __get__ that "
        "stallscope cannot reproduce; attach to the function it wraps, or to an instance"
    )


def plan_instance(owner, name, path):
    """How to wrap attribute `name` of one object (an instance, a module)."""
    try:
        raw = inspect.getattr_static(owner, name)
    except AttributeError:
        raise AttributeError(f"{path} does not exist") from None
    in_dict = name in getattr(owner, "__dict__", {})
    if not in_dict and isinstance(raw, (property, functools.cached_property)):
        raise AttachError(
            f"{path} is a {type(raw).__name__}: reading it is not a call; attach to the "
            "method it reads from"
        )
    current = getattr(owner, name)
    if not callable(current):
        raise AttachError(f"{path} is not callable ({type(current).__name__})")
    func = getattr(current, "__func__", None)
    bound = getattr(current, "__self__", None)
    _refuse_generators(current, path)
    if isinstance(current, types.MethodType) and bound is owner:
        # Holding the bound method would make owner -> wrapper -> method ->
        # owner, a cycle: keep the function and a weak reference instead.
        try:
            ref = weakref.ref(owner)
        except TypeError:
            ref = None
        if ref is not None:
            return Plan(func, "weak", "plain", current, owner_ref=ref)
    if (
        not in_dict
        and bound is not None
        and bound is owner
        or (not in_dict and isinstance(raw, functools.partialmethod))
    ):
        # A C method bound to the owner, a partialmethod's partial: call the
        # class's unbound form with a weak reference to the owner.
        unbound = getattr(type(owner), name) if isinstance(raw, functools.partialmethod) else raw
        if isinstance(unbound, (types.FunctionType, *_METHOD_LIKE)):
            try:
                return Plan(unbound, "weak", "plain", current, owner_ref=weakref.ref(owner))
            except TypeError:
                pass
    if _reaches(current, owner):
        raise AttachError(
            f"{path}: the callable found there refers back to the object it is stored on, "
            "so the wrapper would hold a reference cycle; attach to its class instead"
        )
    if isinstance(current, types.MethodType):
        return Plan(current, "call", "plain", current, bound_self=bound)
    return Plan(current, "call", "plain", current)


def _reaches(start, target, max_depth=4, max_nodes=2000):
    """Whether `target` is reachable from `start` through a few references
    (closures, partial arguments, bound selves): a wrapper holding `start`
    in `target`'s own attributes would then be a cycle."""
    seen = {id(start)}
    frontier = [start]
    for _ in range(max_depth):
        nxt = []
        for obj in frontier:
            for ref in gc.get_referents(obj):
                if ref is target:
                    return True
                if id(ref) not in seen and not isinstance(ref, (type, types.ModuleType)):
                    seen.add(id(ref))
                    nxt.append(ref)
                    if len(seen) > max_nodes:
                        return False
        frontier = nxt
    return False


def shape_for(plan, prefix):
    """The wrapper's parameters for `plan`; sets `self_code`."""
    target = plan.target
    if isinstance(target, types.MethodType) and isinstance(target.__func__, types.FunctionType):
        shape = _code_shape(target.__func__, True, prefix)
    elif isinstance(target, types.FunctionType):
        shape = _code_shape(target, plan.mode == "weak", prefix)
    else:
        shape = _generic_shape(prefix)
    if plan.mode == "class":
        if shape.positional:
            shape.self_code = shape.positional.pop(0)  # still forwarded first
        elif shape.star:
            # def method(*args): self is the tuple's first item.
            shape.self_code = f"{shape.star}[0]"
            shape.star_offset = 1
    elif plan.mode == "weak":
        shape.self_code = f"{prefix}owner()"
    elif plan.bound_self is not None:
        shape.self_code = f"{prefix}self"
    return shape


def resolver(shape, prefix):
    """The expression language's names -> wrapper code, for `shape`."""
    offset = shape.star_offset

    def resolve(name):
        if name == "result":
            return f"{prefix}result"
        if name == "self":
            if not shape.self_code:
                raise _expr.ExprError("`self`: the attached callable has no self")
            return shape.self_code
        n = _expr.arg_index(name)
        if n is not None:
            if n < len(shape.positional):
                return shape.positional[n]
            if shape.star:
                return f"{shape.star}[{n - len(shape.positional) + offset}]"
            raise _expr.ExprError(
                f"`{name}`: the method takes {len(shape.positional)} positional "
                "argument(s) after self"
            )
        if name in shape.names:
            return name
        return None

    return resolve
