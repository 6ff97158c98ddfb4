"""Heap census ingest: a client's CENSUS datagram becomes `heap_census` rows.

A census (probe_client/_census.py) is a JSON object: the totals go to
`heap_census_runs` (one row), each listed type to `heap_census` (at close
with the start census's count of it, `count_start`). Client
values are bounded before they reach a column (a lie costs a NULL or a
`bad_census` rejection, never a failed write), and a run may send at most
`MAX_CENSUSES_PER_RUN`, so none can flood the store. Never blocks and never
raises into the reader loop.
"""

import json
from collections import Counter

from probe_client import wire
from stallscope.ingest.runs import _int

# A client sends one at connect or warm-up and one at close (a few more
# with repeated mark("warm")); more than this from one run is refused.
MAX_CENSUSES_PER_RUN = 16
MAX_TYPES_PER_CENSUS = 2000
PHASES = ("start", "warm", "close")
NAME_MAX = 200


class CensusIngest:
    """The CENSUS half of `Ingest` (a mixin: state lives on the Ingest)."""

    def _census(self, run, data, pid):
        """One CENSUS datagram: a totals row and a row per listed type."""
        try:
            info = json.loads(data[wire.HEADER_SIZE :].decode("utf-8"))
            if not isinstance(info, dict) or info.get("phase") not in PHASES:
                raise ValueError("not a census")
            taken_ns = _int(info.get("taken_ns"))
            types = info.get("types")
            if taken_ns is None or not isinstance(types, list):
                raise ValueError("no time or no types")
            rows = []
            for entry in types[:MAX_TYPES_PER_CENSUS]:
                module, qualname, count, *start = entry
                count = _int(count)
                start = _int(start[0]) if len(start) == 1 else None
                if count is None or count < 0 or (start is not None and start < 0):
                    raise ValueError("bad count")
                rows.append((str(qualname)[:NAME_MAX], str(module)[:NAME_MAX], count, start))
        except (ValueError, TypeError, OverflowError, RecursionError):
            return self._reject(run.run_id, pid, "bad_census")
        counts = self.__dict__.setdefault("_censuses_per_run", Counter())
        counts[run.run_id] += 1
        if counts[run.run_id] > MAX_CENSUSES_PER_RUN:
            return self._reject(run.run_id, pid, "too_many_censuses")

        def ints(v):
            return [_int(x, 32) for x in v[:8]] if isinstance(v, list) else None

        phase = info["phase"]
        self.store.append(
            "heap_census_runs",
            {
                "run_id": [run.run_id],
                "taken_ns": [taken_ns],
                "phase": [phase],
                "duration_ns": [_int(info.get("duration_ns"))],
                "tracked": [_int(info.get("tracked"))],
                "freeze_count": [_int(info.get("freeze_count"))],
                "gc_threshold": [ints(info.get("threshold"))],
                "gc_count": [ints(info.get("count"))],
                "top_n": [_int(info.get("top_n"), 32)],
                "other": [_int(info.get("other"))],
                "other_types": [_int(info.get("other_types"))],
            },
        )
        if rows:
            self.store.append(
                "heap_census",
                {
                    "run_id": [run.run_id] * len(rows),
                    "taken_ns": [taken_ns] * len(rows),
                    "phase": [phase] * len(rows),
                    "type_name": [r[0] for r in rows],
                    "module": [r[1] for r in rows],
                    "count": [r[2] for r in rows],
                    "count_start": [r[3] for r in rows],
                },
            )
        return None
