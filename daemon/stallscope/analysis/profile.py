"""The CPU profile of traced threads: top frames (self and total) and collapsed stacks.

`profile(source, ...)` reads the CPU sampler's tables (cpu_samples,
cpu_stacks, cpu_frames) through a source's `query` (a database file, or a
running daemon's Query API) and answers: which frames the selected samples
were in (self: the leaf; Python self: the innermost Python frame; total:
anywhere in the stack, once per sample), and every distinct stack with its
sample count, root first, in the "collapsed" format that flame-graph tools
read (`a;b;c 123`: Brendan Gregg's flamegraph.pl, speedscope, inferno).
Samples are selected by run (its process between connect and end), by
time, by the stage of the step they fell in, or by the step being slow
(step_attribution.slow). Each sample is one tick of `cpu_sample_hz` on CPU,
so N samples are N / hz seconds of CPU. It only reads.
"""

from dataclasses import dataclass, field

from stallscope.errors import AccessError

# One frame as a short label: `function (file:line)` for Python,
# `function [module]` for native code (file and module by their last part).
_LABEL = """replace(CASE WHEN f.kind = 'py' THEN
    coalesce(f.function, '<unknown>') || ' (' || coalesce(regexp_extract(f.file, '[^/]*$'), '?')
    || ':' || coalesce(CAST(f.line AS VARCHAR), '?') || ')'
  ELSE coalesce(f.function, '[unknown]') || ' [' || coalesce(regexp_extract(f.file, '[^/]*$'), '?')
    || ']' END, ';', ':')"""


@dataclass
class Profile:
    samples: int = 0  # samples selected
    no_stack: int = 0  # of those, samples with nothing known of their code
    kernel_mode: int = 0  # of those, samples taken while in the kernel
    hz: float | None = None  # the sampling rate, when the probe said it
    top_self: list = field(default_factory=list)  # [(kind, label, samples)]
    top_python_self: list = field(default_factory=list)  # [(label, samples)]
    top_total: list = field(default_factory=list)  # [(kind, label, samples)]
    collapsed: list = field(default_factory=list)  # [(root;...;leaf, samples)], most first


def _selection(run_id, from_ns, to_ns, stage, slow):
    """(SQL of the selected samples: ts_ns, tid, stack_id, kernel_mode; params)."""
    where, params, joins = [], [], ""
    if run_id is not None or stage is not None or slow:
        joins = (
            " JOIN runs r ON s.pid = r.pid AND s.ts_ns >= coalesce(r.connected_ns, r.started_ns)"
            " AND s.ts_ns <= coalesce(r.ended_ns, 9223372036854775807)"
        )
    if run_id is not None:
        where.append("r.run_id = ?")
        params.append(int(run_id))
    if from_ns is not None:
        where.append("s.ts_ns >= ?")
        params.append(int(from_ns))
    if to_ns is not None:
        where.append("s.ts_ns < ?")
        params.append(int(to_ns))
    if stage is not None:
        where.append(
            "EXISTS (SELECT 1 FROM spans p WHERE p.run_id = r.run_id AND p.tid = s.tid "
            "AND p.kind = 'step' AND p.stage = ? AND p.start_ns <= s.ts_ns AND s.ts_ns < p.end_ns)"
        )
        params.append(str(stage))
    if slow:
        where.append(
            "EXISTS (SELECT 1 FROM step_attribution a WHERE a.run_id = r.run_id AND a.tid = s.tid "
            "AND a.slow AND a.start_ns <= s.ts_ns AND s.ts_ns < a.end_ns)"
        )
    sql = f"SELECT s.ts_ns, s.tid, s.stack_id, s.kernel_mode FROM cpu_samples s{joins}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    return sql, params


def profile(source, run_id=None, from_ns=None, to_ns=None, stage=None, slow=False, limit=20):
    """The Profile of the samples selected (see the module's docstring)."""
    if run_id is not None:
        _, rows = source.query("SELECT count(*) FROM runs WHERE run_id = ?", [int(run_id)])
        if not rows[0][0]:
            raise AccessError(f"no run {run_id} in the database")
    sel, params = _selection(run_id, from_ns, to_ns, stage, slow)
    prof = Profile()
    _, rows = source.query(
        f"SELECT count(*), count(*) FILTER (WHERE stack_id IS NULL), "
        f"count(*) FILTER (WHERE kernel_mode) FROM ({sel})",
        params,
    )
    prof.samples, prof.no_stack, prof.kernel_mode = (int(v or 0) for v in rows[0])
    if not prof.samples:
        return prof
    frames = (
        f"WITH counts AS (SELECT stack_id, count(*) AS n FROM ({sel}) WHERE stack_id IS NOT NULL "
        "GROUP BY stack_id), "
        f"fr AS (SELECT c.stack_id, c.n, st.depth, f.kind, {_LABEL} AS label FROM counts c "
        "JOIN cpu_stacks st USING (stack_id) JOIN cpu_frames f USING (frame_id)) "
    )
    _, prof.top_self = source.query(
        frames + "SELECT kind, label, sum(n) AS samples FROM fr WHERE depth = 0 "
        f"GROUP BY ALL ORDER BY samples DESC, label LIMIT {int(limit)}",
        params,
    )
    _, rows = source.query(
        frames + "SELECT label, sum(n) AS samples FROM (SELECT label, n, row_number() OVER "
        "(PARTITION BY stack_id ORDER BY depth) AS k FROM fr WHERE kind = 'py') WHERE k = 1 "
        f"GROUP BY ALL ORDER BY samples DESC, label LIMIT {int(limit)}",
        params,
    )
    prof.top_python_self = rows
    _, prof.top_total = source.query(
        frames + "SELECT kind, label, sum(n) AS samples FROM (SELECT DISTINCT stack_id, n, kind, "
        f"label FROM fr) GROUP BY ALL ORDER BY samples DESC, label LIMIT {int(limit)}",
        params,
    )
    _, prof.collapsed = source.query(
        frames + "SELECT stack, sum(n) AS samples FROM (SELECT stack_id, any_value(n) AS n, "
        "string_agg(label, ';' ORDER BY depth DESC) AS stack FROM fr GROUP BY stack_id) "
        "GROUP BY stack ORDER BY samples DESC, stack",
        params,
    )
    _, rows = source.query(
        "SELECT detail FROM probe_status WHERE probe = 'cpu' AND detail LIKE '% Hz per tracked%' "
        "ORDER BY ts_ns DESC LIMIT 1"
    )
    if rows:
        try:
            prof.hz = float(rows[0][0].split(" Hz", 1)[0])
        except ValueError:
            prof.hz = None
    return prof


def format_profile(prof, what):
    """The text `stallscope profile` prints: `what` says which samples."""
    from stallscope.analysis.formatting import format_table

    if not prof.samples:
        return (
            f"no CPU samples for {what} (is the CPU sampler on? `stallscope status` shows "
            "the 'cpu' probe; it needs CAP_BPF+CAP_PERFMON)\n"
        )

    def pct(n):
        return f"{100.0 * n / prof.samples:.1f}%"

    secs = f", {prof.samples / prof.hz:.2f} s of CPU at {prof.hz:g} Hz" if prof.hz else ""
    out = [
        f"{prof.samples:,} CPU samples for {what}{secs}; {pct(prof.kernel_mode)} in the "
        f"kernel, {prof.no_stack:,} without a stack\n",
        "\n== Top frames by self (the leaf: native code when sampled there) ==\n",
        format_table(
            ["self", "%", "kind", "frame"], [(n, pct(n), k, lb) for k, lb, n in prof.top_self]
        ),
        "\n== Top Python frames by self (the innermost Python frame) ==\n",
        format_table(["self", "%", "frame"], [(n, pct(n), lb) for lb, n in prof.top_python_self]),
        "\n== Top frames by total (anywhere in the stack) ==\n",
        format_table(
            ["total", "%", "kind", "frame"], [(n, pct(n), k, lb) for k, lb, n in prof.top_total]
        ),
        "\n== Hottest stacks (root first; --collapsed prints them all for flame graphs) ==\n",
    ]
    for stack, n in prof.collapsed[:5]:
        out.append(f"{n:>8} {pct(n):>6}  {stack.replace(';', ' > ')}\n")
    return "".join(out)


def format_collapsed(prof):
    """One `root;...;leaf count` line per distinct stack (flamegraph.pl's input)."""
    return "".join(f"{stack} {n}\n" for stack, n in prof.collapsed)
