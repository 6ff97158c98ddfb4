"""stallscope's interpreter-start hook: trace this process, then run the user's sitecustomize.

`stallscope run` (or `PYTHONPATH=<this folder>` set by hand, e.g. in a
systemd unit) puts this folder first on the path; it holds only this file.
It loads the stdlib-only probe client from the folder above by file path,
so nothing else next to it (the daemon's packages, their dependencies)
becomes importable, connects, and hooks the attach specs of
$STALLSCOPE_ATTACH / $STALLSCOPE_ATTACH_FILE. Then the next `sitecustomize`
on the path (the user's, the distribution's) runs as if this one were not
there, and its errors are reported by `site` as usual. Nothing of ours ever
stops the interpreter from starting: a failure is one line on stderr.

The probe client needs Python 3.10 or newer. On an older interpreter this
hook does nothing but say so, once per process tree (the environment
remembers it for the command's children), and chain to the next
sitecustomize; so this file keeps to syntax that Python 2.7 and 3.x parse
(str.format, no f-strings, no annotations).
"""

MIN_PYTHON = (3, 10)
SAID_ENV = "STALLSCOPE_UNSUPPORTED_PYTHON_SAID"


def _stallscope_too_old():
    import os
    import sys

    if sys.version_info >= MIN_PYTHON:
        return False
    if not os.environ.get(SAID_ENV):
        os.environ[SAID_ENV] = "1"
        sys.stderr.write(
            "stallscope: not tracing: Python {} is older than {}.{}, the oldest the probe "
            "client supports ({})\n".format(
                sys.version.split()[0], MIN_PYTHON[0], MIN_PYTHON[1], sys.executable
            )
        )
    return True


def _stallscope_start():
    import importlib.util
    import os
    import sys

    try:
        package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        if "probe_client" not in sys.modules:
            spec = importlib.util.spec_from_file_location(
                "probe_client",
                os.path.join(package_dir, "__init__.py"),
                submodule_search_locations=[package_dir],
            )
            module = importlib.util.module_from_spec(spec)
            sys.modules["probe_client"] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules["probe_client"]
                raise
        from probe_client import _autoattach

        _autoattach.start_from_environment()
    except Exception as exc:
        sys.stderr.write(
            "stallscope: not tracing this process: {}: {}\n".format(type(exc).__name__, exc)
        )


def _stallscope_chain():
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import importlib.machinery
        import importlib.util

        importlib.util.module_from_spec  # noqa: B018 (3.5+)
    except (ImportError, AttributeError):
        return _stallscope_chain_imp(path)
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    ours = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        raise


def _stallscope_chain_imp(path):
    # Python 2.7 and 3.4 (this hook only says it does not trace them)
    import imp
    import sys

    try:
        found = imp.find_module("sitecustomize", path)
    except ImportError:
        return
    ours = sys.modules.get("sitecustomize")
    try:
        imp.load_module("sitecustomize", *found)
    except BaseException:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        raise
    finally:
        if found[0] is not None:
            found[0].close()


if not _stallscope_too_old():
    _stallscope_start()
_stallscope_chain()
