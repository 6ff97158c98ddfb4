"""Parts of GetStatus that are plain functions, not servicer state: a
probe's counters as typed JSON, the wall-clock anchor (a CLOCK_REALTIME and
CLOCK_MONOTONIC pair read together) and the package version. Kept apart so
the servicer module stays about serving; nothing here touches the store.
"""

import json
import time

from stallscope.api.values import json_ready


def set_stats(ps, probe):
    """A probe's counters, typed: JSON text per value and as one object."""
    try:
        stats = {str(k): json_ready(v) for k, v in (probe.status() or {}).items()}
    except Exception as exc:
        stats = {"error": f"{type(exc).__name__}: {exc}"}
    for k, v in stats.items():
        ps.stats[k] = v if isinstance(v, str) else json.dumps(v)
    ps.stats_json = json.dumps(stats)


def clock_pair():
    """(CLOCK_REALTIME, CLOCK_MONOTONIC) read as close together as possible:
    the pair with the shortest monotonic bracket of three tries."""
    best = None
    for _ in range(3):
        a = time.monotonic_ns()
        real = time.time_ns()
        b = time.monotonic_ns()
        if best is None or b - a < best[0]:
            best = (b - a, real, (a + b) // 2)
    return best[1], best[2]


def package_version():
    try:
        from importlib.metadata import version

        return version("stallscope")
    except Exception:
        return "unknown"
