"""Shared test fixtures: a real daemon process, temporary sockets and databases.

Tests that need root, bcc, perf or tracefs call `require_privileged(reason)`
(or use the `privileged` marker's helper). Outside CI they skip with the
reason; with STALLSCOPE_REQUIRE_PRIVILEGED=1 (set by .ci/run, which runs as
root) the same condition is a failure, so a green CI run cannot hide a
skipped eBPF test. Tests of a real engine use `engineguard.require_engines()`
the same way (STALLSCOPE_REQUIRE_ENGINES=1).
"""

import os

import pytest

REQUIRE_PRIVILEGED = os.environ.get("STALLSCOPE_REQUIRE_PRIVILEGED") == "1"


def require_privileged(ok, reason):
    """Skip (or, in CI, fail) unless `ok`."""
    if ok:
        return
    if REQUIRE_PRIVILEGED:
        pytest.fail(f"required in CI but unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


def is_root():
    return os.geteuid() == 0
