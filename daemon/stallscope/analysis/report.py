"""Builds the stallscope report: the seed report's tables, from the views.

`build_report(con, out_dir=None, run_ids=None)` returns the text (per-run
table, the generation-2 table, the slow-step breakdown) and, when `out_dir`
is given, writes PNG figures there in the seed's manner: every step of each
run over time with the GC-overlapped ones in red (gen-2) or orange, and a +-1 s zoom around
each generation-2 pass. It only reads: it never writes to the database, so
it works on a read-only connection and on one the daemon lends.
"""

import os

from stallscope.analysis.formatting import format_table

MAX_ZOOM_FIGURES = 24  # one zoom per gen-2 pass, at most this many
ZOOM_HALF_WIDTH_NS = 1_000_000_000


def _run_filter(run_ids):
    """SQL predicate on run_id for the selected runs (all when None)."""
    if run_ids is None:
        return "TRUE"
    ids = sorted({int(r) for r in run_ids})
    return f"run_id IN ({', '.join(map(str, ids))})" if ids else "FALSE"


def _rows(con, sql):
    cur = con.execute(sql)
    return [d[0] for d in cur.description], cur.fetchall()


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
    return text + format_table(head, rows)


def _gen2_section(con, where):
    _, rows = _rows(
        con,
        f"""
        SELECT run_id, label, window_s, in_window, step_idx, window_steps, pause_ms,
               collected, stage, batch, step_ms, in_prefill, stall
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
    ) in rows:
        note = (
            "prefill step: not counted as a stall"
            if in_prefill
            else "overlapped no step"
            if stage is None
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
        f"{sum(1 for r in rows if r[8] is None)} overlapped no step.\n"
    )
    return text


CAUSES = ("gc", "preemption", "blocked", "migration", "gpu_clock", "submit", "unexplained")


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
                *counts,
            )
        )
    text += format_table(
        [
            "stage",
            "batch",
            "steps",
            "slow",
            "slow %",
            "excess ms",
            "in submit %",
            "top cause",
            *CAUSES,
        ],
        table,
    )
    non_prefill = [r for r in rows if r[0] != "prefill"]
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
    zooms = 0
    for run_id in runs:
        w0 = con.execute(
            "SELECT window_start_ns FROM step_window WHERE run_id = ?", [run_id]
        ).fetchone()[0]
        d = con.execute(
            """
            SELECT start_ns, duration_ns, coalesce(stage = 'prefill', false) AS prefill,
                   gc_ns > 0 AS gc, coalesce(gc_generation = 2, false) AS gen2
            FROM step_attribution WHERE run_id = ? ORDER BY start_ns""",
            [run_id],
        ).fetchnumpy()
        if len(d["start_ns"]) == 0:
            continue
        t_s = (d["start_ns"].astype(np.int64) - w0) / 1e9
        ms = d["duration_ns"].astype(np.int64) / 1e6
        prefill = np.asarray(d["prefill"], dtype=bool)
        gc = np.asarray(d["gc"], dtype=bool)
        gen2 = np.asarray(d["gen2"], dtype=bool)
        fig, ax = plt.subplots(figsize=(10, 4.5))
        plain = ~gc & ~prefill
        ax.scatter(t_s[plain], ms[plain], s=3, c="tab:blue", lw=0, rasterized=True, label="step")
        if prefill.any():
            ax.scatter(
                t_s[prefill & ~gc],
                ms[prefill & ~gc],
                s=6,
                c="0.6",
                marker="x",
                lw=0.6,
                rasterized=True,
                label="prefill step",
            )
        young = gc & ~gen2
        if young.any():
            ax.scatter(
                t_s[young], ms[young], s=8, c="tab:orange", lw=0, label="overlaps a gen-0/1 pass"
            )
        if gen2.any():
            ax.scatter(t_s[gen2], ms[gen2], s=22, c="tab:red", lw=0, label="overlaps a gen-2 pass")
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
        for k, (gs, ge) in enumerate(passes):
            if zooms >= MAX_ZOOM_FIGURES:
                break
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
            zooms += 1
    return paths


def build_report(con, out_dir=None, run_ids=None):
    """The report's text; with out_dir, also writes its PNG figures there."""
    where = _run_filter(run_ids)
    runs, steps = con.execute(
        f"SELECT count(DISTINCT run_id), count(*) FROM _step WHERE {where}"
    ).fetchone()
    parts = [
        f"stallscope report: {_n(runs, 'run')}, {_n(steps, 'step')}\n",
        _runs_section(con, where),
        _gen2_section(con, where),
        _slow_section(con, where),
    ]
    if out_dir is not None:
        paths = _figures(con, where, out_dir)
        parts.append(
            "== Figures ==\n"
            + ("".join(p + "\n" for p in paths) if paths else "(no steps to plot)\n")
        )
    return "\n".join(parts)
