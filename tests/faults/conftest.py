"""Fixtures for the fault, load and security suite.

Every test has a CI size (the default: the whole directory runs in well under
three minutes on two cores) and a full size (`--full` or
STALLSCOPE_FULL_FAULTS=1, `make faults`). Tests report their figures through
the `figures` fixture; they are printed at the end of the run and, with
STALLSCOPE_FAULTS_FIGURES=path, appended to that file as JSON lines (the
source of RELIABILITY.md's tables).
"""

import json
import os
import time

import pytest

_FIGURES = []


def pytest_addoption(parser):
    parser.addoption(
        "--full",
        action="store_true",
        default=False,
        help="run the fault suite at full size (1 M fuzz inputs, 32 clients x 60 s)",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "faults: fault, load and security suite (tests/faults)")


def is_full(config):
    return (
        bool(config.getoption("--full", default=False))
        or os.environ.get("STALLSCOPE_FULL_FAULTS") == "1"
    )


@pytest.fixture(scope="session")
def full(pytestconfig):
    return is_full(pytestconfig)


@pytest.fixture
def figures(request, full):
    """A dict the test fills with what it measured."""
    figs = {}
    yield figs
    if figs:
        entry = {
            "test": request.node.name,
            "size": "full" if full else "ci",
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **figs,
        }
        _FIGURES.append(entry)
        path = os.environ.get("STALLSCOPE_FAULTS_FIGURES")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(entry, sort_keys=True) + "\n")


def pytest_terminal_summary(terminalreporter):
    if not _FIGURES:
        return
    terminalreporter.section("fault suite figures")
    for entry in _FIGURES:
        terminalreporter.write_line(json.dumps(entry, sort_keys=True))
