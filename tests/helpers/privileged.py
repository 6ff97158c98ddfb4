"""The one rule for tests that need root, bcc, perf, tracefs or mounts.

`require_privileged(ok, reason)` skips with the reason when `ok` is false;
with STALLSCOPE_REQUIRE_PRIVILEGED=1 (set by .ci/run, which runs as root)
the same condition is a failure, so a green CI run cannot hide a skipped
eBPF test.
"""

import os

import pytest

from helpers.markers import require_marker

REQUIRE_PRIVILEGED = os.environ.get("STALLSCOPE_REQUIRE_PRIVILEGED") == "1"


def require_privileged(ok, reason):
    """Skip (or, in CI, fail) unless `ok`; only in a test marked `privileged`."""
    require_marker("privileged", "needs privileges (require_privileged)")
    if ok:
        return
    if REQUIRE_PRIVILEGED:
        pytest.fail(f"required in CI but unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


def is_root():
    return os.geteuid() == 0
