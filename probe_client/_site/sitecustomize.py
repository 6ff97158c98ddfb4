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
"""


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
        sys.stderr.write(f"stallscope: not tracing this process: {type(exc).__name__}: {exc}\n")


def _stallscope_chain():
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
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


_stallscope_start()
_stallscope_chain()
