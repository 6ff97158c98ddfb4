"""The report's request section: per run, TTFT and ITL distributions with
the causes of their tails, and the requests a stall hurt most.

From `request_run_latency` (per run: TTFT p50/p90/p99 over its requests, ITL
p50/p90/p99/max over every inter-token gap, end to end, and the causes of
the slowest 1 %) and `request_latency` (per request: its worst gap, the step
that ended it and that step's cause). The hurt-most list is the MAX_HURT
requests with the longest worst gap, each as the sentence an operator reads
first ("request req-4711: worst inter-token gap 96.1 ms at step 17,022,
cause gc"). Runs without request events leave the section out. Read-only.
"""

from stallscope.analysis.formatting import format_table, query_rows

MAX_HURT = 5


def _ms(ns):
    return None if ns is None else round(ns / 1e6, 2)


def request_section(con, where):
    """The section's text, '' when the selected runs have no request events."""
    # Planning the request_run_latency view tree takes 1.5-3 s even when it
    # has nothing to read; every row of it comes from request_events.
    if not con.execute(f"SELECT 1 FROM request_events WHERE {where} LIMIT 1").fetchone():
        return ""
    _, runs = query_rows(
        con,
        f"""
        SELECT run_id, requests, finished, aborted, ttft_p50_ns, ttft_p90_ns, ttft_p99_ns,
               itl_p50_ns, itl_p90_ns, itl_p99_ns, itl_max_ns, e2e_p99_ns,
               ttft_tail_causes, itl_tail_causes
        FROM request_run_latency WHERE {where} ORDER BY run_id""",
    )
    if not runs:
        return ""
    table = [
        (
            run,
            n,
            fin,
            ab,
            *(_ms(v) for v in (t50, t90, t99, i50, i90, i99, imax, e99)),
            tt or "",
            it or "",
        )
        for run, n, fin, ab, t50, t90, t99, i50, i90, i99, imax, e99, tt, it in runs
    ]
    text = "== Requests ==\n" + format_table(
        ["run", "requests", "finished", "aborted", "TTFT p50 ms", "p90", "p99", "ITL p50 ms",
         "p90", "p99", "max", "e2e p99 ms", "slowest 1% TTFT by cause", "slowest 1% ITL by cause"],
        table,
    )  # fmt: skip
    _, hurt = query_rows(
        con,
        f"""
        SELECT run_id, coalesce(text, request_id::VARCHAR), itl_max_ns, worst_step_idx,
               worst_cause, worst_gap, ttft_ns
        FROM request_latency WHERE {where} AND itl_max_ns IS NOT NULL
        ORDER BY itl_max_ns DESC, run_id, request_id LIMIT {MAX_HURT}""",
    )
    if hurt:
        text += "Hurt most (longest inter-token gap):\n"
        for run, req, gap, step, cause, kind, ttft in hurt:
            why = {"preempted": "the engine preempted the request",
                   "not_scheduled": "steps ran without it"}.get(kind)  # fmt: skip
            if why is None and step is None:
                why = "its token was recorded outside any step"
            elif why is None:
                why = f"at step {step:,}, " + (f"cause {cause}" if cause else "not slow")
            elif step is not None:
                why = f"at step {step:,}, {why}"
            text += (
                f"  run {run}, request {req}: worst inter-token gap {_ms(gap)} ms, "
                + why
                + (f" (TTFT {_ms(ttft)} ms)" if ttft is not None else "")
                + "\n"
            )
    return text
