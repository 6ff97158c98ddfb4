"""Tracing without editing the engine: connect at interpreter start, attach on import.

`start_from_environment()` is what the injected `sitecustomize` calls: it
connects a probe labelled from `$STALLSCOPE_RUN_LABEL` (a child process gets
its parent's label plus `/child-PID`, a fork `/fork-PID`) with the census
and GC knobs of `$STALLSCOPE_CENSUS...`/`$STALLSCOPE_GC_...` (_gcknobs.py), reads the attach
specs of `$STALLSCOPE_ATTACH` and `$STALLSCOPE_ATTACH_FILE`, patches the
targets whose modules are already imported, and installs a post-import hook
(a `sys.meta_path` finder that wraps the found loader's `exec_module`) that
patches the others right after their module runs. A spec that cannot be
used (bad text, a missing attribute, an expression `attach()` refuses, a
module never imported) is reported once per process, on stderr and to the
daemon as a run event, and the others keep working. Nothing here raises
into the engine or runs on its hot path; the hook only looks at module
names until one of ours is imported. Standard library only.
"""

import functools
import os
import sys
import threading
import types

from . import _codegen, _expr, _gcknobs, _specs
from ._probe import Probe
from ._transport import _live_probes

LABEL_ENV = "STALLSCOPE_RUN_LABEL"
ATTACH_ENV = "STALLSCOPE_ATTACH"
ATTACH_FILE_ENV = "STALLSCOPE_ATTACH_FILE"
CHECKED_ENV = "STALLSCOPE_RUN_CHECKED"  # the wrapper already said whether a daemon is there
VERBOSE_ENV = "STALLSCOPE_VERBOSE"
PARENT_ENV = "_STALLSCOPE_PARENT"  # "PID:LABEL" of the traced process that started us
SPEC_ERRORS_ENV = "_STALLSCOPE_SPEC_ERRORS"  # bad TOML entries the wrapper found, one a line
# A spec's `role` (plain text, not an EXPR: "engine core", "worker") is no
# attach() keyword: once its target is attached, the process reports it as a
# `role` run event.
ROLE_KEY = "role"
EXPR_KEYWORDS = (
    "stage",
    "batch",
    "work",
    "idle",
    *_codegen.REQUEST_KEYS,
)  # checked early; others go to attach() as they are


def _say(message):
    try:
        sys.stderr.write(f"stallscope: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass


class EventProbe(Probe):
    """A probe that sends run events (EVENT datagrams: a problem with a
    spec, an attached target); `Probe.event()` does the work, kept under
    this name for callers that check for it."""


class _Finder:
    """The post-import hook: finds our target modules through the other
    finders and wraps their loader's `exec_module`."""

    def __init__(self, hooks):
        self._hooks = hooks
        self._local = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self._hooks.pending:
            return None
        busy = self._local.__dict__.setdefault("busy", set())
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            busy.discard(fullname)
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        if isinstance(loader, type) or not hasattr(loader, "__dict__"):
            spec.loader = _LoaderProxy(loader, self._hooks, fullname)
            return spec
        original = loader.exec_module
        hooks = self._hooks

        def exec_module(module):
            try:
                original(module)
            finally:
                # The loader is ours only for this one import.
                loader.__dict__.pop("exec_module", None)
            hooks.imported(fullname, module)

        loader.exec_module = exec_module
        return spec

    def invalidate_caches(self):
        pass


class _LoaderProxy:
    """For loaders that are classes (builtin, frozen): delegate, then patch."""

    def __init__(self, loader, hooks, fullname):
        self._loader = loader
        self._hooks = hooks
        self._fullname = fullname

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._hooks.imported(self._fullname, module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class Hooks:
    """Which specs wait for which module, and the reports about them."""

    def __init__(self, probe, verbose=False):
        self.probe = probe
        self.verbose = verbose
        self.pending = {}  # module name -> [Spec], until the module is imported
        self.attached = []  # (Spec, wrapper)
        self._reported = set()
        self._lock = threading.RLock()
        self.finder = None

    def report(self, kind, target, message):
        """Say it once per process: on stderr and to the daemon."""
        key = (kind, target, message if not target else "")
        with self._lock:
            if key in self._reported:
                return
            self._reported.add(key)
        if kind != "attached" or self.verbose:
            _say(f"{target}: {message}" if target else message)
        event = getattr(self.probe, "event", None)
        if event is not None:
            event(kind, target, message)

    def add(self, specs):
        """Attach what is imported now; hook the rest."""
        for spec in specs:
            bad = _check_expressions(spec)
            if bad:
                self.report("attach_failed", spec.text, bad)
                continue
            module = sys.modules.get(spec.module)
            if module is not None:
                self._attach(spec, module)
            else:
                with self._lock:
                    self.pending.setdefault(spec.module, []).append(spec)
        if self.pending and self.finder is None:
            self.finder = _Finder(self)
            sys.meta_path.insert(0, self.finder)

    def imported(self, fullname, module):
        with self._lock:
            specs = self.pending.pop(fullname, [])
        for spec in specs:
            self._attach(spec, module)

    def _attach(self, spec, module):
        keywords = dict(spec.keywords)
        role = keywords.pop(ROLE_KEY, None)
        try:
            wrapper = self.probe.attach(module, spec.path, kind=spec.kind, **keywords)
        except Exception as exc:
            self.report("attach_failed", spec.text, _why(exc, spec))
            return
        self.attached.append((spec, wrapper))
        self.report("attached", spec.text, f"attached to {spec.target} as {spec.kind!r}")
        if role:
            self._role_on_first_call(module, spec, wrapper, role.strip()[:40])

    def _role_on_first_call(self, module, spec, wrapper, role):
        """Report `role` (the process's part in its run group) when the
        wrapped method first runs in this process: every process of an
        engine imports the module, only one plays the part. A one-shot shim
        stands in for the wrapper until that call and puts the wrapper back,
        so later calls cost nothing more."""
        owner = module
        *outer, name = spec.path.split(".")
        for part in outer:
            owner = getattr(owner, part, None)
        if not isinstance(owner, type) or owner.__dict__.get(name) is not wrapper:
            return
        if not isinstance(wrapper, types.FunctionType):
            return
        hooks = self

        @functools.wraps(wrapper)
        def first_call(*args, **kwargs):
            if owner.__dict__.get(name) is first_call:
                setattr(owner, name, wrapper)
                hooks.report("role", "", role)
            return wrapper(*args, **kwargs)

        setattr(owner, name, first_call)

    def never_imported(self):
        """At exit: the specs whose module this process never imported."""
        with self._lock:
            left = [s for specs in self.pending.values() for s in specs]
        for spec in left:
            if not spec.optional:
                self.report(
                    "never_imported",
                    spec.text,
                    f"module {spec.module} was never imported by this process, so "
                    f"{spec.path} was not traced (a spec starting with '?' is optional)",
                )


def _check_expressions(spec):
    """Why an EXPR is outside the language (before its module is even
    imported), or None. Names are resolved at attach time."""
    for key in EXPR_KEYWORDS:
        text = spec.keywords.get(key)
        if text is None:
            continue
        try:
            _expr.compile_expr(text, lambda name: name)
        except _expr.ExprError as exc:
            return f"{key}: {exc}"
        except Exception as exc:
            return f"{key}: {exc}"
    return None


def _why(exc, spec):
    if isinstance(exc, AttributeError):
        return str(exc)
    if isinstance(exc, TypeError) and "unexpected keyword" in str(exc):
        return f"this probe's attach() does not take that keyword ({exc})"
    return f"{type(exc).__name__}: {exc}"


def _label_for(pid):
    """This process's run label: the wrapper's, or its parent's plus a suffix."""
    parent = os.environ.get(PARENT_ENV, "")
    parent_pid, _, parent_label = parent.partition(":")
    if parent_pid and parent_pid != str(pid):
        return f"{parent_label}/child-{pid}", True
    return os.environ.get(LABEL_ENV) or parent_label or "", False


def _read_specs(hooks, is_child):
    specs, errors = _specs.split_specs(os.environ.get(ATTACH_ENV, ""))
    if not is_child:  # the wrapper's findings, said by the process it started
        errors += [e for e in os.environ.get(SPEC_ERRORS_ENV, "").split("\n") if e]
    for path in filter(None, os.environ.get(ATTACH_FILE_ENV, "").split(os.pathsep)):
        try:
            more, errs = _specs.specs_from_toml(_specs.load_toml(path), path)
        except _specs.SpecError as exc:
            more, errs = [], [str(exc)]
        specs += more
        errors += errs
    for error in errors:
        hooks.report("spec_error", "", error)
    return specs


_state = {}


def start_from_environment():
    """Connect, read the specs and install the hook (once per process)."""
    if _state.get("hooks") is not None:
        return _state["hooks"]
    pid = os.getpid()
    label, is_child = _label_for(pid)
    try:
        settings = _gcknobs.settings_from_environment()
    except ValueError as exc:
        _say(f"GC knobs not applied: {exc}")
        settings = {}
    probe = EventProbe(run_label=label, **settings)
    os.environ[PARENT_ENV] = f"{pid}:{label}"
    hooks = Hooks(probe, verbose=os.environ.get(VERBOSE_ENV) == "1")
    _state["hooks"] = hooks
    _state["base_label"] = label
    _state["is_child"] = is_child
    if not probe.connected and not is_child and os.environ.get(CHECKED_ENV) != "1":
        _say(
            f"warning: no daemon at {probe.socket_path}; this process runs untraced "
            "until one is there (the probe retries once a second)"
        )
    hooks.add(_read_specs(hooks, is_child))
    import atexit

    atexit.register(_at_exit)
    os.register_at_fork(after_in_child=_after_fork_child)
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        # A multiprocessing fork child leaves through os._exit(): no atexit,
        # but threading's shutdown runs first; send what is buffered then.
        try:
            register(_flush_for_fork_child)
        except RuntimeError:
            pass
    return hooks


def _at_exit():
    # Only the command's own process says "never imported": a child (a
    # worker, multiprocessing's resource tracker) imports what its job needs.
    hooks = _state.get("hooks")
    if hooks is not None and not _state.get("is_child"):
        hooks.never_imported()


def _after_fork_child():
    hooks = _state.get("hooks")
    if hooks is None:
        return
    pid = os.getpid()
    label = f"{_state['base_label']}/fork-{pid}"
    _state["base_label"] = label
    _state["is_child"] = True
    hooks.probe.run_label = label  # read by the HELLO of the child's first connection
    os.environ[PARENT_ENV] = f"{pid}:{label}"


def _flush_for_fork_child():
    hooks = _state.get("hooks")
    if hooks is not None and hooks.probe in _live_probes:
        hooks.probe.flush()
