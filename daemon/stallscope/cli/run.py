"""`stallscope run`: trace a command's Python processes without editing them.

Builds the environment that loads the probe at interpreter start (the
injected `sitecustomize` folder first on PYTHONPATH, the attach specs of
--attach, --attach-file and --preset flattened into $STALLSCOPE_ATTACH,
the run label) and then replaces itself with the command (`exec`), so its
exit status, signals, stdio and pid are the command's own. It never runs
the command under a shell, never waits for a daemon (an absent one is a
warning), and never puts the daemon's packages on the command's path.
`--no-client` injects nothing and has the daemon follow the command's GC
from outside (cli/run_noclient.py).
"""

import os
import shlex
import socket
import sys

from stallscope.cli.command import Command
from stallscope.errors import StallscopeError

PRESET_PATH_ENV = "STALLSCOPE_PRESET_PATH"

_USER_PRESET_DIRS = ("~/.config/stallscope/presets", "/etc/stallscope/presets")


class RunError(StallscopeError):
    """The command cannot be started as asked (unknown preset, unreadable
    file, no such program)."""


def site_dir():
    """The folder `stallscope run` puts first on PYTHONPATH (only a sitecustomize.py)."""
    import probe_client

    return os.path.join(os.path.dirname(os.path.abspath(probe_client.__file__)), "_site")


def preset_dirs():
    """Where --preset NAME looks, first match wins: $STALLSCOPE_PRESET_PATH,
    ~/.config/stallscope/presets, /etc/stallscope/presets, then the shipped ones."""
    dirs = [d for d in os.environ.get(PRESET_PATH_ENV, "").split(os.pathsep) if d]
    dirs += [os.path.expanduser(d) for d in _USER_PRESET_DIRS]
    from importlib import resources

    dirs.append(str(resources.files("stallscope.presets")))
    return dirs


def find_preset(name):
    """The TOML file of preset `name` (or `name` itself when it is a path)."""
    if os.sep in name or name.endswith(".toml"):
        if not os.path.isfile(name):
            raise RunError(f"preset file {name} does not exist")
        return name
    for folder in preset_dirs():
        path = os.path.join(folder, f"{name}.toml")
        if os.path.isfile(path):
            return path
    raise RunError(f"no preset named {name!r} (known: {', '.join(list_presets()) or 'none'})")


def list_presets():
    """{name: (path, description)}, first of each name in search order."""
    found = {}
    for folder in preset_dirs():
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for entry in names:
            if entry.endswith(".toml") and entry[:-5] not in found:
                found[entry[:-5]] = os.path.join(folder, entry)
    return found


def _load_toml(path):
    from probe_client import _specs

    try:
        return _specs.load_toml(path)
    except _specs.SpecError as exc:
        raise RunError(str(exc)) from None


def collect_specs(attach, attach_files, presets):
    """(STALLSCOPE_ATTACH text, [errors]) from the command line's specs.

    --attach texts pass through untouched (the traced process checks and
    reports them); TOML entries are converted to the text form here, and a
    bad entry becomes an error the traced process reports for us."""
    from probe_client import _specs

    texts, errors = [t.strip() for t in attach if t.strip()], []
    files = [(path, path) for path in attach_files]
    files += [(find_preset(name), f"preset {name}") for name in presets]
    for path, source in files:
        specs, errs = _specs.specs_from_toml(_load_toml(path), source)
        texts += [_specs.format_spec(spec) for spec in specs]
        errors += errs
    return ";".join(texts), errors


GROUP_ENV = "STALLSCOPE_GROUP"


def _file_group(attach_files):
    """The run-group key of the first --attach-file with a top-level `group`."""
    for path in attach_files:
        group = _load_toml(path).get("group")
        if isinstance(group, str) and group.strip():
            return group.strip()
    return None


def default_label(command):
    """The program's name: the script or module for a Python command."""
    name = os.path.basename(command[0])
    if name.startswith("python"):
        args = iter(command[1:])
        for arg in args:
            if arg == "-m":
                return next(args, name)
            if arg in ("-c", "-W", "-X", "--check-hash-based-pycs"):
                if arg == "-c":
                    return name
                next(args, None)
                continue
            if not arg.startswith("-"):
                return os.path.basename(arg)
    return name


def build_env(args, command, base=None):
    """The command's environment: ours added to `base` (default os.environ)."""
    from probe_client import _autoattach

    env = dict(os.environ if base is None else base)
    env.pop(_autoattach.PARENT_ENV, None)  # the command is a new root, not a child
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = site_dir() + (os.pathsep + old if old else "")
    env[_autoattach.LABEL_ENV] = args.label or default_label(command)
    if args.socket:
        env["STALLSCOPE_SOCKET"] = args.socket
    group = getattr(args, "group", None) or _file_group(args.attach_file)
    if group:
        env[GROUP_ENV] = group  # ranks started apart (torchrun, ray) join one run group
    env.update(gc_environment(args))
    text, errors = collect_specs(args.attach, args.attach_file, args.preset)
    env[_autoattach.ATTACH_ENV] = text
    if errors:
        env[_autoattach.SPEC_ERRORS_ENV] = "\n".join(errors)
    else:
        env.pop(_autoattach.SPEC_ERRORS_ENV, None)
    return env


def gc_environment(args):
    """The census and GC-knob variables for --census, --census-after,
    --gc-freeze-after and --gc-threshold (RunError on a bad value)."""
    from probe_client import _gcknobs as k

    env = {}
    try:
        if getattr(args, "census", False) or getattr(args, "census_after", None) is not None:
            env[k.CENSUS_ENV] = "1"
        if getattr(args, "census_after", None) is not None:
            env[k.CENSUS_AFTER_ENV] = repr(k.parse_seconds(args.census_after, "--census-after"))
        if getattr(args, "gc_freeze_after", None) is not None:
            seconds = k.parse_seconds(args.gc_freeze_after, "--gc-freeze-after")
            env[k.FREEZE_AFTER_ENV] = repr(seconds)
        if getattr(args, "gc_threshold", None) is not None:
            values = k.parse_threshold(args.gc_threshold)
            env[k.THRESHOLD_ENV] = ",".join(map(str, values))
    except ValueError as exc:
        raise RunError(str(exc)) from None
    return env


def daemon_reachable(path):
    """Why no daemon answers at `path`, or None when one does."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(1.0)
        sock.connect(path)
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        sock.close()
    return None


def _arguments(parser):
    parser.add_argument("--label", help="run label (default: the program's name)")
    parser.add_argument(
        "--socket",
        help="the daemon's probe socket (default: $STALLSCOPE_SOCKET or "
        "/run/stallscope/probe.sock)",
    )
    parser.add_argument(
        "--group",
        metavar="KEY",
        help="run-group key ($STALLSCOPE_GROUP): processes started apart that "
        "belong to one engine (the ranks of torchrun or ray); it joins only "
        "runs of the same uid",
    )
    parser.add_argument(
        "--attach",
        action="append",
        default=[],
        metavar="SPEC",
        help="module:Qualname.method=kind[,KEY=EXPR]... (repeatable; README: "
        "'Trace your engine without editing it')",
    )
    parser.add_argument(
        "--attach-file",
        action="append",
        default=[],
        metavar="TOML",
        help="a TOML file of [[attach]] tables (repeatable)",
    )
    parser.add_argument(
        "--preset",
        action="append",
        default=[],
        metavar="NAME",
        help="an engine's specs: transformers, vllm, sglang, your own (repeatable)",
    )
    parser.add_argument(
        "--census",
        action="store_true",
        help="send a type histogram of the GC-tracked heap at start and exit "
        "(heap_growth view; ~0.1-0.25 s per million tracked objects, twice)",
    )
    parser.add_argument(
        "--census-after",
        metavar="SECONDS",
        help="take the start census SECONDS after start (after warm-up) instead; implies --census",
    )
    parser.add_argument(
        "--gc-freeze-after",
        metavar="SECONDS",
        help="gc.collect() then gc.freeze() SECONDS after start (recorded in runs)",
    )
    parser.add_argument(
        "--gc-threshold",
        metavar="A,B,C",
        help="gc.set_threshold(A, B, C) at start (recorded in runs)",
    )
    parser.add_argument(
        "--no-client",
        action="store_true",
        help="inject nothing: the daemon records the command's GC passes from outside "
        "(CPython's USDT markers, e.g. Debian's /usr/bin/python3); no steps",
    )
    parser.add_argument("--list-presets", action="store_true", help="list presets and exit")
    parser.add_argument(
        "--print-env",
        action="store_true",
        help="print the environment that traces a process without this wrapper "
        "(shell syntax) and exit",
    )
    parser.add_argument("cmd", nargs="*", metavar="-- CMD [ARGS...]")


def run_run(args):
    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    if args.list_presets:
        for name, path in list_presets().items():
            print(f"{name:14} {_description(path)}  ({path})")
        return 0
    if not command and not args.print_env:
        raise RunError("no command given: stallscope run [OPTIONS] -- CMD [ARGS...]")
    if args.no_client:
        if gc_environment(args):
            raise RunError(
                "--census, --census-after, --gc-freeze-after and --gc-threshold act inside "
                "the process: not with --no-client"
            )
        return _run_without_client(args, command)
    env = build_env(args, command or ["python"])
    if args.print_env:
        for name in (
            "PYTHONPATH",
            "STALLSCOPE_RUN_LABEL",
            "STALLSCOPE_SOCKET",
            "STALLSCOPE_ATTACH",
            *sorted(gc_environment(args)),
        ):
            if name in env and env.get(name) != os.environ.get(name, None):
                print(f"export {name}={shlex.quote(env[name])}")
        return 0
    from probe_client import DEFAULT_SOCKET, _autoattach

    path = env.get("STALLSCOPE_SOCKET") or DEFAULT_SOCKET
    why = daemon_reachable(path)
    if why is not None:
        print(
            f"stallscope: warning: no daemon at {path} ({why}); {command[0]} runs untraced "
            "until one is there (the probe retries once a second)",
            file=sys.stderr,
        )
    env[_autoattach.CHECKED_ENV] = "1"
    _exec(command, env)
    return 0  # not reached


def _run_without_client(args, command):
    if args.print_env or args.attach or args.attach_file or args.preset:
        raise RunError(
            "--no-client injects nothing: --attach, --attach-file, --preset and "
            "--print-env need the client"
        )
    from probe_client import DEFAULT_SOCKET
    from stallscope.cli import run_noclient

    path = args.socket or os.environ.get("STALLSCOPE_SOCKET") or DEFAULT_SOCKET
    why = daemon_reachable(path)
    if why is not None:
        run_noclient.warn(f"no daemon at {path} ({why}); {command[0]} runs untraced")
    else:
        run_noclient.prepare(path, args.label or default_label(command), command[0])
    _exec(command, dict(os.environ))
    return 0  # not reached


def _exec(command, env):
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        # The shell's statuses: 127 not found, 126 found but not executable.
        error = RunError(f"{command[0]}: {exc.strerror}")
        error.exit_status = 127 if isinstance(exc, FileNotFoundError) else 126
        raise error from None


def _description(path):
    try:
        return str(_load_toml(path).get("description", "")).split("\n")[0]
    except RunError as exc:
        return f"(unreadable: {exc})"


RUN = Command(
    help="run a command with its Python processes traced (no source edit)",
    description="Run CMD with the probe loaded at interpreter start in every Python "
    "process it starts, and the methods the specs name wrapped as soon as their module "
    "is imported. Exit status, signals and stdio are CMD's own (it replaces this "
    "process). Child processes are their own runs, labelled LABEL/child-PID or "
    "LABEL/fork-PID.",
    add_arguments=_arguments,
    run=run_run,
    examples=(
        "stallscope run --preset transformers -- python serve.py   # HF continuous batching",
        "stallscope run --attach 'engine:Engine._step=step,batch=len(arg0)' -- python app.py",
        "stallscope run --no-client -- /usr/bin/python3 app.py   # GC only, nothing injected",
    ),
)
