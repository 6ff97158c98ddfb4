"""Whether the Spark fleet test can run: the `fleet` extra (pyspark) and Java.

`require_spark()` skips with the reason and the fix when either is missing;
with STALLSCOPE_REQUIRE_FLEET=1 (set by .ci/run and `make fleet`, whose
bootstrap installs the extra) the same condition is a failure, so a green
run cannot hide a skipped Spark test (the rule of `privileged.py`).
"""

import importlib.util
import os
import shutil

import pytest

REQUIRE_FLEET = os.environ.get("STALLSCOPE_REQUIRE_FLEET") == "1"


def require_spark():
    """Skip (or, with STALLSCOPE_REQUIRE_FLEET=1, fail) unless pyspark and java exist."""
    missing = []
    if importlib.util.find_spec("pyspark") is None:
        missing.append("pyspark (STALLSCOPE_FLEET=1 make bootstrap)")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        missing.append("a Java runtime >= 17 (apt-get install openjdk-17-jre-headless)")
    if not missing:
        return
    reason = f"the Spark fleet test needs {' and '.join(missing)}"
    if REQUIRE_FLEET:
        pytest.fail(f"required but unavailable: {reason}", pytrace=False)
    pytest.skip(reason)
