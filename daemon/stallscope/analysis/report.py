"""Builds the stallscope report: the seed report's tables, from the views.

`build_report(con, out_dir=None, run_ids=None)` returns the text (per-run
table, the generation-2 table, the heap growers and GC advice, the slow-step
breakdown by cause, the on-CPU part (analysis/oncpu.py), the top
preemptors and wakers per run, the run groups (analysis/sections/groups.py), the
hang watchdog's dumps (analysis/sections/hangs.py) and the probes' coverage) and, when
`out_dir` is given, writes PNG figures there in the seed's manner: every
step of each run over time with slow steps coloured by cause, a +-1 s
zoom around generation-2 passes (a budget per run, longest passes first),
and differential flame graphs.
It only reads, so it works on a read-only connection or one the daemon lends.
On a DuckDB connection it computes `step_attribution` once for the whole
report (a temporary table that shadows the view for every section and every
view built on it) and drops it at the end: each reading of the view costs a
full plan and join whatever it returns, and the sections read it ~7 times.
"""

import contextlib
import os

import duckdb

from stallscope.analysis.formatting import format_table
from stallscope.analysis.formatting import query_rows as _rows
from stallscope.analysis.gc_forensics import gc_section
from stallscope.analysis.oncpu import flame_figures, oncpu_section
from stallscope.analysis.sections.coverage import coverage_section
from stallscope.analysis.sections.groups import group_section
from stallscope.analysis.sections.hangs import hang_section
from stallscope.analysis.sections.requests import request_section
from stallscope.vocab import rules

MAX_ZOOM_FIGURES = 24  # zooms in all, shared out per run (at least one each), longest passes first
ZOOM_HALF_WIDTH_NS = 1_000_000_000


def _run_filter(run_ids):
    """SQL predicate on run_id for the selected runs (all when None)."""
    if run_ids is None:
        return "TRUE"
    ids = sorted({int(r) for r in run_ids})
    return f"run_id IN ({', '.join(map(str, ids))})" if ids else "FALSE"


def _n(count, noun, plural="s"):
    return f"{count:,} {noun}" + ("" if count == 1 else plural)


def _fmt_int(n):
    return f"{n:,}" if n is not None else ""


def _runs_section(con, where):
    cols, rows = _rows(
        con,
        f"""
        SELECT run_id, label, steps, mean_step_ms, p50_step_ms, p99_step_ms, max_step_ms,
               long_steps, long_non_prefill, long_non_prefill_no_gc, slow_steps,
               gen0_count, gen0_pause_ms, gen0_max_ms, gen1_count, gen1_pause_ms, gen1_max_ms,
               gen2_count, gen2_pause_ms, gen2_max_ms
        FROM seed_runs WHERE {where} ORDER BY run_id""",
    )
    head = [
        "run",
        "label",
        "steps",
        "mean ms",
        "p50 ms",
        "p99 ms",
        "max ms",
        ">100ms",
        ">100ms non-prefill",
        "of which no GC",
        "slow",
        "gen0 n",
        "gen0 ms",
        "gen0 max",
        "gen1 n",
        "gen1 ms",
        "gen1 max",
        "gen2 n",
        "gen2 ms",
        "gen2 max",
    ]
    text = "== Runs ==\n"
    if not rows:
        return text + "(no runs with steps or GC passes)\n"
    return text + format_table(head, rows) + _placement_table(con, where)


def _placement_table(con, where):
    """Where each run ran (run_placement), under the run table."""
    _, rows = _rows(
        con,
        f"""
        SELECT run_id, cpu_time, sibling_busy_pct, cpu_node, mem_node, numa_remote, clock_mhz,
               hash_seed, affinity, cgroup_cpus
        FROM run_placement WHERE {where} ORDER BY run_id""",
    )
    if not rows:
        return "(placement: no run covered by the placement probe)\n"
    head = ["run", "CPU time", "SMT sibling busy %", "CPU node", "memory node", "remote",
            "clock MHz", "hash seed", "affinity", "cgroup CPUs"]  # fmt: skip
    reasons = {
        r[0]
        for r in con.execute(
            f"SELECT DISTINCT reasons FROM run_placement WHERE {where} AND reasons IS NOT NULL"
        ).fetchall()
    }
    note = ("placement not known here: " + "; ".join(sorted(reasons)) + "\n") if reasons else ""
    return "Placement:\n" + format_table(head, rows) + note


def _gen2_section(con, where):
    _, rows = _rows(
        con,
        f"""
        SELECT run_id, label, window_s, in_window, step_idx, window_steps, pause_ms,
               collected, stage, batch, step_ms, in_prefill, stall, in_idle
        FROM seed_gen2 WHERE {where} ORDER BY run_id, gc_start_ns""",
    )
    text = "== Generation-2 collections ==\n"
    if not rows:
        return text + "(no generation-2 collection)\n"
    table = []
    for (
        run_id,
        label,
        window_s,
        in_window,
        idx,
        n,
        pause,
        collected,
        stage,
        batch,
        step_ms,
        in_prefill,
        _stall,
        in_idle,
    ) in rows:
        note = (
            "prefill step: not counted as a stall"
            if in_prefill
            else "overlapped no step"
            if step_ms is None
            else "idle step: not counted as a stall"
            if in_idle
            else ""
            if in_window
            else "before/after the window"
        )
        table.append(
            (
                run_id,
                label or "",
                window_s,
                f"{_fmt_int(idx)} / {_fmt_int(n)}" if idx is not None else "",
                pause,
                collected,
                stage or "",
                batch,
                step_ms,
                note,
            )
        )
    text += format_table(
        [
            "run",
            "label",
            "s into window",
            "step index",
            "pause ms",
            "collected",
            "stage",
            "batch",
            "step ms",
            "note",
        ],
        table,
    )
    pauses = sorted(r[6] for r in rows)
    median = (
        pauses[len(pauses) // 2]
        if len(pauses) % 2
        else (pauses[len(pauses) // 2 - 1] + pauses[len(pauses) // 2]) / 2
    )
    runs = len({r[0] for r in rows})
    stalls = sum(1 for r in rows if r[12])
    prefill = sum(1 for r in rows if r[11])
    text += (
        f"{_n(len(rows), 'generation-2 pass', 'es')} in {_n(runs, 'run')}; pauses {pauses[0]:g}-{pauses[-1]:g} ms "
        f"(median {median:g} ms); {stalls} stalled a non-prefill step, {prefill} landed in prefill, "
        f"{sum(1 for r in rows if r[10] is None)} overlapped no step.\n"
    )
    return text


CAUSES = rules.CAUSES


def _slow_section(con, where):
    factor = con.execute("SELECT slow_factor FROM step_params").fetchone()[0]
    cause_sums = ", ".join(f"sum(cause_{c})::BIGINT" for c in CAUSES)
    _, rows = _rows(
        con,
        f"""
        SELECT stage, batch, sum(steps)::BIGINT, sum(slow_steps)::BIGINT,
               sum(excess_ns)::BIGINT, sum(submit_excess_ns)::BIGINT, {cause_sums}
        FROM seed_slow_steps WHERE {where}
        GROUP BY stage, batch ORDER BY stage, batch""",
    )
    text = f"== Slow steps (duration > {factor:g} x median of the run's steps of that stage and batch) ==\n"
    if not rows:
        return text + "(no steps)\n"
    total_slow = sum(r[3] for r in rows)
    unexplained = sum(r[6 + CAUSES.index("unexplained")] for r in rows)
    uncovered = sum(r[6 + CAUSES.index("uncovered")] for r in rows)
    text += (
        f"Unexplained share of slow steps: {unexplained:,} of {total_slow:,}"
        + (f" ({100 * unexplained / total_slow:.1f}%)" if total_slow else "")
        + (f"; {uncovered:,} more uncovered (a probe missed them)" if uncovered else "")
        + ".\n"
    )
    shown = [i for i, c in enumerate(CAUSES) if c == "unexplained" or any(r[6 + i] for r in rows)]
    table = []
    for stage, batch, steps, slow, excess, in_submit, *counts in rows:
        top = max(range(len(CAUSES)), key=lambda i: (counts[i], -i)) if slow else None
        table.append(
            (
                stage or "",
                batch,
                steps,
                slow,
                round(100 * slow / steps, 2),
                round(excess / 1e6, 3),
                round(100 * in_submit / excess, 1) if excess else None,
                CAUSES[top] if top is not None else "",
                *(counts[i] for i in shown),
            )
        )
    head = ["stage", "batch", "steps", "slow", "slow %", "excess ms", "in submit %", "top cause"]
    text += format_table([*head, *(CAUSES[i] for i in shown)], table)
    prefill_stage = con.execute("SELECT prefill_stage FROM step_params").fetchone()[0]
    non_prefill = [r for r in rows if r[0] != prefill_stage]
    steps = sum(r[2] for r in non_prefill)
    slow = sum(r[3] for r in non_prefill)
    excess = sum(r[4] for r in non_prefill)
    in_submit = sum(r[5] for r in non_prefill)
    counts = [sum(r[6 + i] for r in non_prefill) for i in range(len(CAUSES))]
    if steps:
        text += (
            f"Non-prefill steps: {slow:,} of {steps:,} slow ({100 * slow / steps:.2f}%)"
            + (
                f", {excess / 1e6 / slow:.3f} ms above the median on average; "
                f"{100 * in_submit / excess:.1f}% of their excess inside submit"
                if slow and excess
                else ""
            )
            + ". Causes: "
            + ", ".join(f"{c} {n:,}" for c, n in zip(CAUSES, counts, strict=True) if n)
            + ("" if any(counts) else "none")
            + ".\n"
        )
    return text


def _who_section(con, where):
    """The tasks that took the CPU from slow steps, and the threads they waited on."""
    _, rows = _rows(
        con,
        f"""
        WITH a AS MATERIALIZED (  -- one pass over the view, not one per role
            SELECT run_id, preemptor_comm, preemptor_pid, preemptor_run_id, preempted_ns,
                   waker_comm, waker_tid, waker_run_id,
                   coalesce(lock_ns, 0) + coalesce(peer_ns, 0) + coalesce(blocked_ns, 0) AS waited_ns
            FROM step_attribution
            WHERE {where} AND slow AND (preemptor_comm IS NOT NULL OR waker_comm IS NOT NULL)
        ), w AS (
            SELECT run_id, 'preemptor' AS role, preemptor_comm AS comm, preemptor_pid AS id,
                   preemptor_run_id AS of_run, preempted_ns AS ns
            FROM a WHERE preemptor_comm IS NOT NULL
            UNION ALL
            SELECT run_id, 'waker', waker_comm, waker_tid, waker_run_id, waited_ns
            FROM a WHERE waker_comm IS NOT NULL
        )
        SELECT run_id, role, comm, id, any_value(of_run), count(*), round(sum(ns) / 1e6, 3)
        FROM w GROUP BY run_id, role, comm, id
        QUALIFY row_number() OVER (PARTITION BY run_id, role ORDER BY sum(ns) DESC, comm) <= 5
        ORDER BY run_id, role, sum(ns) DESC, comm""",
    )
    text = "== Top preemptors and wakers of slow steps (5 per run) ==\n"
    if not rows:
        return text + "(none named: the sched probe records no preemptor or waker)\n"
    return text + format_table(
        ["run", "role", "comm", "pid / tid", "traced run", "slow steps", "their ms"], rows
    )


# One fixed colour per cause (gc red, as in the seed's figures; common ones far apart).
CAUSE_COLOURS = {
    "gc": "tab:red",
    "gpu_wait": "darkorange",
    "lock": "tab:cyan",
    "peer": "tab:brown",
    "runqueue": "tab:orange",
    "throttled": "gold",
    "preemption": "tab:purple",
    "blocked": "tab:olive",
    "irq": "navy",
    "steal": "tab:pink",
    "page_fault": "teal",
    "syscall": "lime",
    "migration": "sienna",
    "launch": "darkgreen",
    "code": "orangered",
    "submit": "tab:green",
    "gpu_clock": "magenta",
    "cpu_slow": "darkgoldenrod",
    "uncovered": "0.45",
    "unexplained": "black",
}


def cause_colour(cause):
    return CAUSE_COLOURS.get(cause, "tab:gray")


def _figures(con, where, out_dir):
    """Writes the PNGs; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    runs = [
        r[0]
        for r in con.execute(
            f"SELECT DISTINCT run_id FROM _step WHERE {where} ORDER BY run_id"
        ).fetchall()
    ]
    for run_id in runs:
        w0 = con.execute(
            "SELECT window_start_ns FROM step_window WHERE run_id = ?", [run_id]
        ).fetchone()[0]
        d = con.execute(
            """
            SELECT a.start_ns, a.duration_ns, coalesce(a.stage = p.prefill_stage, false) AS prefill,
                   a.gc_ns > 0 AS gc, coalesce(a.gc_generation = 2, false) AS gen2,
                   coalesce(a.cause, '') AS cause, a.idle
            FROM step_attribution a, step_params p WHERE a.run_id = ? ORDER BY a.start_ns""",
            [run_id],
        ).fetchnumpy()
        if len(d["start_ns"]) == 0:
            continue
        t_s = (d["start_ns"].astype(np.int64) - w0) / 1e9
        ms = d["duration_ns"].astype(np.int64) / 1e6
        prefill = np.asarray(d["prefill"], dtype=bool)
        gen2 = np.asarray(d["gen2"], dtype=bool)
        cause = np.asarray(d["cause"], dtype=object)
        idle = np.asarray(d["idle"], dtype=bool)
        slow = cause != ""
        fig, ax = plt.subplots(figsize=(10, 4.5))
        plain = ~slow & ~prefill & ~idle
        ax.scatter(t_s[plain], ms[plain], s=3, c="tab:blue", lw=0, rasterized=True, label="step")
        for mask, colour, marker, label in (
            (prefill & ~slow, "0.6", "x", "prefill step"),
            (idle, "0.8", ".", "idle step"),
        ):
            if mask.any():
                ax.scatter(
                    t_s[mask],
                    ms[mask],
                    s=6,
                    c=colour,
                    marker=marker,
                    lw=0.6,
                    rasterized=True,
                    label=label,
                )
        for name in [c for c in CAUSES if (cause == c).any()]:
            sel = cause == name
            ax.scatter(
                t_s[sel],
                ms[sel],
                s=14 if name != "gc" else 22,
                c=cause_colour(name),
                lw=0,
                label=f"slow: {name} ({int(sel.sum())})",
            )
        if (gen2 & ~slow).any():
            ax.scatter(
                t_s[gen2 & ~slow],
                ms[gen2 & ~slow],
                s=22,
                facecolors="none",
                edgecolors="tab:red",
                label="overlaps a gen-2 pass",
            )
        ax.set_yscale("log")
        ax.set_xlabel("s into the measurement window")
        ax.set_ylabel("step duration (ms)")
        ax.set_title(f"run {run_id}: every step")
        ax.legend(loc="upper left", fontsize=8)
        path = os.path.join(out_dir, f"run_{run_id}_steps.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

        passes = con.execute(
            """SELECT start_ns, end_ns FROM gc_events
                                WHERE run_id = ? AND generation = 2 ORDER BY start_ns""",
            [run_id],
        ).fetchall()
        # each run gets its share of the zooms, spent on its longest passes
        budget = max(1, MAX_ZOOM_FIGURES // len(runs))
        worst = sorted(range(len(passes)), key=lambda i: passes[i][0] - passes[i][1])[:budget]
        for k in sorted(worst):
            gs, ge = passes[k]
            lo, hi = gs - ZOOM_HALF_WIDTH_NS, ge + ZOOM_HALF_WIDTH_NS
            sel = (d["start_ns"] >= lo) & (d["start_ns"] <= hi)
            ends = d["start_ns"] + d["duration_ns"]
            hit = sel & (d["start_ns"] < ge) & (ends > gs)
            fig, ax = plt.subplots(figsize=(7, 4.5))
            ax.axvspan(
                (gs - w0) / 1e9, (ge - w0) / 1e9, color="tab:red", alpha=0.15, label="gen-2 pass"
            )
            rest = sel & ~hit
            ax.scatter(
                t_s[rest],
                ms[rest],
                s=8,
                c=np.where(prefill[rest], "0.6", "tab:blue"),
                lw=0,
                label="step",
            )
            if hit.any():
                ax.scatter(t_s[hit], ms[hit], s=24, c="tab:red", lw=0, label="overlaps the pass")
            ax.set_xlim((lo - w0) / 1e9, (hi - w0) / 1e9)
            ax.set_xlabel("s into the measurement window")
            ax.set_ylabel("step duration (ms)")
            ax.set_title(
                f"run {run_id}: within 1 s of gen-2 pass {k + 1} ({(ge - gs) / 1e6:.1f} ms)"
            )
            ax.legend(loc="upper left", fontsize=8)
            path = os.path.join(out_dir, f"run_{run_id}_gen2_{k + 1}.png")
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            plt.close(fig)
            paths.append(path)
    return paths


@contextlib.contextmanager
def attribution_read_once(con):
    """`step_attribution` computed once while the block runs.

    DuckDB looks names up in the temporary catalog first, so a temporary
    table of that name stands in for the view, in the sections' queries and
    in the views that read it (step_profile_diff, request_run_latency...),
    and every section sees the same rows. Not done through the daemon's API
    (its sandbox refuses anything but reads: the sections then read the view
    itself), nor when a temporary table of that name is already there; if
    the table cannot be made (memory), the view is read as before."""
    if (
        not isinstance(con, duckdb.DuckDBPyConnection)
        or con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = 'step_attribution'"
        ).fetchone()[0]
    ):
        yield
        return
    db = con.execute("SELECT current_database()").fetchone()[0].replace('"', '""')
    try:
        con.execute(
            f'CREATE TEMPORARY TABLE step_attribution AS SELECT * FROM "{db}".main.step_attribution'
        )
    except duckdb.Error:
        yield
        return
    try:
        yield
    finally:
        con.execute("DROP TABLE IF EXISTS temp.main.step_attribution")


def build_report(con, out_dir=None, run_ids=None):
    """The report's text; with out_dir, also writes its PNG figures there."""
    with attribution_read_once(con):
        return _build_report(con, out_dir, run_ids)


def _build_report(con, out_dir, run_ids):
    where = _run_filter(run_ids)
    runs, steps = con.execute(
        f"SELECT count(DISTINCT run_id), count(*) FROM _step WHERE {where}"
    ).fetchone()
    parts = [
        f"stallscope report: {_n(runs, 'run')}, {_n(steps, 'step')}\n",
        _runs_section(con, where),
        _gen2_section(con, where),
        gc_section(con, where),
        _slow_section(con, where),
        oncpu_section(con, where),
        _who_section(con, where),
        request_section(con, where),
        group_section(con, where),
        hang_section(con, where),
        coverage_section(con, where),
    ]
    if out_dir is not None:
        paths = _figures(con, where, out_dir) + flame_figures(con, where, out_dir)
        parts.append(
            "== Figures ==\n"
            + ("".join(p + "\n" for p in paths) if paths else "(no steps to plot)\n")
        )
    return "\n".join(p for p in parts if p)
