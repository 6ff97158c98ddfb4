"""The report's GC forensics: the top heap growers and the freeze/threshold advice.

`gc_section(con, where)` answers the seed report's questions 1 and 2 from
the `heap_growth` and `gc_advice` views: which types grew the tracked heap
between the start (or warm) census and the close census, and what
`gc.freeze()` after warm-up or another gen-2 threshold would change, with
the arithmetic written out and its assumptions stated. Runs without a
census get the gen-2 figures and a line saying how to take one. It only
reads the database.
"""

from stallscope.analysis.formatting import format_table

TOP_GROWERS = 10

ASSUMPTIONS = (
    "Assumptions: a gen-2 pass's pause is linear in the objects it walks; the objects "
    "walked at a pass are the tracked heap interpolated in time between the two censuses "
    "(garbage included); CPython <= 3.13 runs a gen-2 pass only after more than "
    "threshold[2] gen-1-eligible passes AND when what survived into generation 2 since "
    "the last one exceeds 25% of the long-lived heap (the '25% rule'); gc.get_objects() "
    "and so the census skip frozen objects.\n"
)


def _i(n):
    return f"{int(n):,}" if n is not None else "?"


def growth_section(con, where):
    rows = con.execute(
        f"""
        SELECT run_id, module || '.' || type_name, count_start, count_end, growth, from_phase, span_s
        FROM (SELECT *, row_number() OVER (PARTITION BY run_id ORDER BY growth DESC) AS k
              FROM heap_growth WHERE {where})
        WHERE k <= {TOP_GROWERS} ORDER BY run_id, growth DESC"""
    ).fetchall()
    text = f"== Heap growth (top {TOP_GROWERS} types per run, census to census) ==\n"
    if not rows:
        return text + (
            "(no run with a start and a close census: `stallscope run --census` or "
            "probe_client.connect(census=True))\n"
        )
    return text + format_table(
        ["run", "type", "at start", "at close", "growth", "from", "over s"],
        [(r, t, _i(a), _i(b), f"{g:+,}", ph, s) for r, t, a, b, g, ph, s in rows],
    )


def _advice_lines(a):
    out = [f"run {a['run_id']} ({a['label'] or 'no label'}), Python {a['python'] or '?'}"]
    knobs = []
    if a["gc_freeze_after_s"] is not None:
        knobs.append(f"gc.freeze() after {a['gc_freeze_after_s']:g} s")
    if a["gc_threshold_set"] is not None:
        knobs.append(f"threshold set to {tuple(a['gc_threshold_set'])}")
    if knobs:
        out.append("  knobs applied: " + ", ".join(knobs))
    n2 = a["gen2_count"]
    if n2:
        interval = (
            f"median {a['interval_median_s']} s apart"
            if a["interval_median_s"] is not None
            else "only one, no interval"
        )
        out.append(
            f"  gen-2 passes: {n2}, pause median {a['pause_median_ms']} ms, max "
            f"{a['pause_max_ms']} ms, median {_i(a['collected_median'])} objects collected; "
            f"{interval}"
        )
    else:
        out.append("  no gen-2 pass in this run: nothing for a freeze or threshold to shorten")
    if a["tracked_start"] is None:
        out.append(
            "  no census pair: the freeze arithmetic needs the tracked heap "
            "(`stallscope run --census`)"
        )
    else:
        out.append(
            f"  census ({a['census_from']} -> close): {_i(a['tracked_start'])} -> "
            f"{_i(a['tracked_end'])} tracked objects outside the frozen generation; freeze count "
            f"{_i(a['freeze_count_start'])} -> {_i(a['freeze_count_end'])}"
        )
    if n2 and a["ns_per_object"] is not None:
        out.append(
            f"  pause per object walked: {a['pause_median_ms']} ms / ~{_i(a['walked_est'])} "
            f"objects = {a['ns_per_object']} ns"
        )
        walk_after = max(0, (a["walked_est"] or 0) - a["freeze_objects"])
        if a["freeze_count_start"]:
            out.append(
                f"  already frozen: {_i(a['freeze_count_start'])} objects at the "
                f"{a['census_from']} census, so its passes walk only the ~{_i(a['walked_est'])} "
                f"unfrozen ones (the cost per object then includes freeing what they collect)"
            )
            return _threshold_lines(a, out)
        out.append(
            f"  gc.freeze() at the {a['census_from']} census would freeze "
            f"{_i(a['freeze_objects'])} objects; a gen-2 pass would then walk ~{_i(walk_after)}: "
            f"{a['ns_per_object']} ns x {_i(walk_after)} = {a['pause_after_freeze_est_ms']} ms "
            f"instead of {a['pause_median_ms']} ms"
        )
    return _threshold_lines(a, out)


def _threshold_lines(a, out):
    n2 = a["gen2_count"]
    if n2 and a["threshold2"] is not None:
        eligible = a["eligible_per_gen2"]
        if a["threshold2_binding"]:
            out.append(
                f"  threshold: {eligible} gen-1-eligible passes per gen-2 pass against "
                f"threshold[2] = {a['threshold2']}: the threshold set the pace; "
                f"threshold[2] >= {a['threshold2_for_half']} at least halves the gen-2 passes"
            )
        else:
            out.append(
                f"  threshold: {eligible} gen-1-eligible passes per gen-2 pass against "
                f"threshold[2] = {a['threshold2']}: the 25% rule, not the threshold, set the "
                f"pace, so raising threshold[2] changes nothing until it reaches "
                f"{int(eligible)}; threshold[2] >= {a['threshold2_for_half']} at least halves "
                f"the passes"
            )
        out.append(
            f"  after a freeze the 25% rule measures against the unfrozen heap only: up to "
            f"{_i(a['gen2_max_if_rule_off'])} gen-2 passes over this run (one per "
            f"threshold[2] + 1 = {a['threshold2'] + 1} gen-1-eligible passes), each walking "
            f"only what was not frozen; measure it: `stallscope run --gc-freeze-after S` "
            f"and `stallscope compare --arm A --arm B`"
        )
    return out


def advice_section(con, where):
    cur = con.execute(f"SELECT * FROM gc_advice WHERE {where} ORDER BY run_id")
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    text = "== GC advice: freeze after warm-up, or another gen-2 threshold? ==\n"
    if not rows:
        return text + "(no run with a gen-2 pass or a census)\n"
    lines = []
    for a in rows:
        lines += _advice_lines(a)
    return text + "\n".join(lines) + "\n" + ASSUMPTIONS


def gc_section(con, where):
    """Both GC forensics parts of the report, as one text block."""
    return growth_section(con, where) + "\n" + advice_section(con, where)
