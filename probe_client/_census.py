"""Heap census: a type histogram of the GC-tracked heap, taken at set-up and close only.

`take_census(phase, top_n, baseline)` walks `gc.get_objects()` once and
returns the encoded CENSUS payload and the full histogram (as bytes, kept
by the probe for the close census): the top `top_n` types by count (module
and qualified name); at close, also every type the start census ranked and,
per row, the start census's count of it from its full histogram, so growth
is exact for every type either census ranked; an "other" total,
the number of tracked objects, `gc.get_freeze_count()`, the thresholds,
`gc.get_count()` and the census's own duration. It is never called on the
engine's hot path (only from connect, close, `Probe.mark("warm")` and the
`census_after_s` timer); its heap walk and counting run in C holding the
GIL, so every thread waits for most of its duration (measured and stored
with it). What it leaves
behind is bytes (never GC-tracked): no object survives it, and the objects
it makes while counting are made after the heap list is taken, so they are
not counted. `gc.get_objects()` omits frozen objects (`gc.freeze()`): the
counts are of the heap a collection walks. Standard library only.
"""

import gc as _gc
import json
import time
from collections import Counter

from . import wire

DEFAULT_TOP_N = 30
NAME_MAX = 200  # characters of a module or qualified name


def _name(tp):
    module = getattr(tp, "__module__", None)
    qualname = getattr(tp, "__qualname__", None)
    module = module if isinstance(module, str) else "builtins"
    qualname = qualname if isinstance(qualname, str) else repr(tp)
    # NUL and newline separate the fields of the kept histogram.
    return (
        module[:NAME_MAX].replace("\0", " ").replace("\n", " "),
        qualname[:NAME_MAX].replace("\0", " ").replace("\n", " "),
    )


def take_census(phase, top_n=DEFAULT_TOP_N, baseline=None):
    """(CENSUS payload as UTF-8 JSON bytes, this census's full histogram as bytes).

    `baseline` is the histogram bytes of an earlier census: then every row
    also carries that census's count of the type (exact growth), and the
    types it ranked in its top `top_n` are listed even when they fell out
    of this one's (count 0 when gone)."""
    t0 = time.monotonic_ns()
    objects = _gc.get_objects()  # a new list that does not hold itself
    tracked = len(objects)
    by_type = Counter(map(type, objects))  # made after the list: not counted
    del objects
    by_name = Counter()
    for tp, n in by_type.items():
        by_name[_name(tp)] += n  # two types may share a name: summed
    del by_type
    ranked = by_name.most_common()
    top = ranked[: max(0, int(top_n))]
    rows = [[m, q, n] for (m, q), n in top]
    if baseline is not None:
        before = {}
        for i, line in enumerate(baseline.decode("utf-8").split("\n") if baseline else ()):
            module, qualname, count = line.split("\0")
            before[(module, qualname)] = (int(count), i < top_n)
        listed = {key for key, _ in top}
        for key, (_, ranked_then) in before.items():
            if ranked_then and key not in listed:
                rows.append([key[0], key[1], by_name.get(key, 0)])
        for row in rows:
            row.append(before.get((row[0], row[1]), (0, False))[0])
        del before, listed
    histogram = "\n".join(f"{m}\0{q}\0{n}" for (m, q), n in ranked).encode("utf-8")
    other = tracked - sum(row[2] for row in rows)
    other_types = len(by_name) - sum(1 for row in rows if row[2])
    del by_name, ranked, top
    info = {
        "phase": phase,
        "taken_ns": t0,
        "tracked": tracked,
        "freeze_count": _gc.get_freeze_count() if hasattr(_gc, "get_freeze_count") else None,
        "threshold": list(_gc.get_threshold()),
        "count": list(_gc.get_count()),
        "top_n": int(top_n),
        "other": other,
        "other_types": other_types,
        "types": rows,
    }
    del rows
    while True:
        info["duration_ns"] = time.monotonic_ns() - t0
        data = json.dumps(info, separators=(",", ":")).encode("utf-8", "replace")
        if len(data) <= wire.HELLO_MAX or not info["types"]:
            return data, histogram
        # Too long for one datagram: the last rows join "other" (the earlier
        # census's kept types are last, so they go first).
        dropped = info["types"].pop()
        info["other"] += dropped[2]
        info["other_types"] += 1 if dropped[2] else 0
