"""The two markers that `make test-fast` leaves out, and their enforcement.

`daemon`: the test starts a real `stallscope daemon` (or `demo`) process.
`privileged`: the test needs root, bcc, perf or tracefs
(`helpers.privileged.require_privileged`). `tests/conftest.py` records the
running test here before its fixtures are set up; a daemon started, or
`require_privileged` called, from a test without the marker fails it, so
the fast subset cannot silently grow slow or start needing root.
"""

import subprocess

import pytest

CURRENT = {"item": None}
_POPEN_INIT = subprocess.Popen.__init__


def has_marker(name):
    item = CURRENT["item"]
    return item is None or item.get_closest_marker(name) is not None


def require_marker(name, what):
    """Fail the running test unless it carries marker `name`."""
    if not has_marker(name):
        pytest.fail(
            f"{CURRENT['item'].nodeid} {what} but has no `{name}` marker: add "
            f"`pytestmark = pytest.mark.{name}` to its file (`make test-fast` leaves "
            f"{name} tests out, docs/development.md)",
            pytrace=False,
        )


def starts_daemon(args):
    """True for a command line that runs `stallscope daemon` or `stallscope demo`."""
    argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else [str(args)]
    ours = any("stallscope.cli" in a or a.rsplit("/", 1)[-1] == "stallscope" for a in argv)
    return ours and any(a in ("daemon", "demo") for a in argv)


def _guarded_popen_init(self, args, *rest, **kw):
    if starts_daemon(args):
        require_marker("daemon", "starts a stallscope daemon")
    _POPEN_INIT(self, args, *rest, **kw)


def install():
    subprocess.Popen.__init__ = _guarded_popen_init
