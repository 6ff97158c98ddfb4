"""Suite-wide: the `daemon` and `privileged` markers are enforced
(helpers/markers.py); the running test is recorded before its fixtures run,
module-scoped ones included."""

import pytest

from helpers import markers

markers.install()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    markers.CURRENT["item"] = item


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield
    markers.CURRENT["item"] = None
