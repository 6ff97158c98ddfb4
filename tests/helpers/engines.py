"""Whether the real-engine tests can run: the `engines` extra (torch CPU, transformers), the `vllm` one.

`require_engines()` skips a test with the reason and the fix when the extra
is missing; with STALLSCOPE_REQUIRE_ENGINES=1 (set by .ci/run, whose
bootstrap installs the extra) the same condition is a failure, so a green CI
run cannot hide a skipped engine test (the rule of `privileged.py`).
"""

import importlib.util
import os

import pytest

REQUIRE_ENGINES = os.environ.get("STALLSCOPE_REQUIRE_ENGINES") == "1"
ENGINE_MODULES = ("torch", "transformers", "psutil")


def require_engines():
    """Skip (or, in CI, fail) unless the engines extra is installed."""
    missing = [m for m in ENGINE_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return
    reason = f"needs the engines extra ({', '.join(missing)} missing): STALLSCOPE_ENGINES=1 make bootstrap"
    if REQUIRE_ENGINES:
        pytest.fail(f"required in CI but unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


REQUIRE_VLLM = os.environ.get("STALLSCOPE_REQUIRE_VLLM") == "1"
VLLM_MODULES = ("vllm", "transformers")


def require_vllm():
    """Skip (or, with STALLSCOPE_REQUIRE_VLLM=1 as in CI, fail) unless the
    `vllm` extra (vLLM's CPU build) is installed and importable."""
    missing = [m for m in VLLM_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return
    reason = (
        f"needs the vllm extra ({', '.join(missing)} missing): STALLSCOPE_VLLM=1 make bootstrap"
    )
    if REQUIRE_VLLM:
        pytest.fail(f"required in CI but unavailable: {reason}", pytrace=False)
    pytest.skip(reason)
