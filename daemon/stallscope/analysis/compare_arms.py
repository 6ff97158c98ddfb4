"""Compares arms of runs (A/B tests such as "gc.freeze() after warm-up or not").

`compare_arms(con, arms)` takes two or more arms, each a list of run ids or
labels (a label names every run that carries it), and returns text: per arm
its runs and the GC knobs applied to them (`runs.gc_freeze_after_s`,
`runs.gc_threshold_set`), gen-2 passes per run inside the run's step
window (`step_window`: the 'window' span, else first to last step) and
their pause median and max (a knob's own gc.collect(), `gc_forced_passes`,
left out and counted),
non-prefill steps > 100 ms per run, steps > 100 ms that overlap no GC pass
per run, and the p99 step time per stage. Per-run figures get a bootstrap
interval over the arm's runs when it has at least `MIN_RUNS_FOR_INTERVAL`
runs, and a plain statement that they are too few otherwise; p99s get a
bootstrap interval over the arm's steps; last, each run's placement (run_placement)
beside its median step. Resampling is seeded, so the same database gives
the same text. It only reads the database.
"""

import numpy as np

from stallscope.analysis.compare import resolve_run
from stallscope.analysis.formatting import format_table
from stallscope.errors import RunNotFound

MIN_RUNS_FOR_INTERVAL = 3
BOOTSTRAP_ROUNDS = 1000
SEED = 17


def resolve_arm(con, spec):
    """Run ids of one arm: `spec` is a list of ids or labels, or one text
    with commas (`3,4,5`, `baseline`); a label names all its runs."""
    items = spec if isinstance(spec, (list, tuple)) else str(spec).split(",")
    ids = []
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        by_label = [
            r[0]
            for r in con.execute(
                "SELECT run_id FROM runs WHERE label = ? ORDER BY run_id", [item]
            ).fetchall()
        ]
        ids += by_label if by_label else [resolve_run(con, item)]
    if not ids:
        raise RunNotFound(f"arm {spec!r} names no run")
    return sorted(set(ids))


def _interval(values, stat=np.mean):
    """(estimate, low, high) of `stat` with a 95% bootstrap interval."""
    values = np.asarray(values, dtype=float)
    rng = np.random.default_rng(SEED)
    picks = rng.integers(0, len(values), size=(BOOTSTRAP_ROUNDS, len(values)))
    boot = np.array([stat(values[p]) for p in picks])
    return float(stat(values)), float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))


def _per_run(values, n_runs):
    if not values:
        return "no runs"
    if n_runs < MIN_RUNS_FOR_INTERVAL:
        shown = ", ".join(f"{v:g}" for v in values)
        return f"{shown} (too few runs for an interval: {n_runs} < {MIN_RUNS_FOR_INTERVAL})"
    est, lo, hi = _interval(values)
    return f"{est:.2f} per run [{lo:.2f}, {hi:.2f}] (95% bootstrap over {n_runs} runs)"


def _arm_figures(con, ids):
    marks = ", ".join("?" * len(ids))
    # Serving passes: inside the run's step window (the 'window' span, else
    # first to last step), a knob's own gc.collect() left out.
    gen2 = f"""(
        SELECT g.* FROM gc_events g JOIN step_window w USING (run_id)
        WHERE g.generation = 2 AND g.run_id IN ({", ".join(str(int(i)) for i in ids)})
          AND g.start_ns >= w.window_start_ns AND g.start_ns < w.window_end_ns
          AND NOT EXISTS (SELECT 1 FROM gc_forced_passes f
                          WHERE f.run_id = g.run_id AND f.start_ns = g.start_ns))"""
    per_run = con.execute(
        f"""
        SELECT r.run_id,
               (SELECT count(*) FROM {gen2} g WHERE g.run_id = r.run_id),
               coalesce(s.long_non_prefill, 0),
               (SELECT count(*) FROM step_attribution a CROSS JOIN step_params p
                WHERE a.run_id = r.run_id AND NOT a.idle AND a.duration_ns > p.long_step_ns
                  AND coalesce(a.gc_ns, 0) = 0),
               r.gc_freeze_after_s, r.gc_threshold_set, r.label
        FROM runs r LEFT JOIN seed_runs s USING (run_id)
        WHERE r.run_id IN ({marks}) ORDER BY r.run_id""",
        ids,
    ).fetchall()
    pauses = [r[0] for r in con.execute(f"SELECT (end_ns - start_ns) / 1e6 FROM {gen2}").fetchall()]
    forced = con.execute(
        f"SELECT count(*) FROM gc_forced_passes WHERE run_id IN ({marks})", ids
    ).fetchone()[0]
    steps = con.execute(
        f"SELECT coalesce(stage, ''), duration_ns / 1e6 FROM _step "
        f"WHERE NOT idle AND run_id IN ({marks})",
        ids,
    ).fetchall()
    by_stage = {}
    for stage, ms in steps:
        by_stage.setdefault(stage, []).append(ms)
    return per_run, pauses, by_stage, forced


def _knobs(per_run):
    seen = set()
    for _, _, _, _, freeze, threshold, _ in per_run:
        parts = []
        if freeze is not None:
            parts.append(f"--gc-freeze-after {freeze:g}")
        if threshold is not None:
            parts.append("--gc-threshold " + ",".join(map(str, threshold)))
        seen.add(" ".join(parts) or "none")
    return "; ".join(sorted(seen))


def compare_arms(con, arms):
    """Text comparing the arms (each a list of run ids or labels)."""
    if len(arms) < 2:
        raise RunNotFound("compare --arm needs at least two arms (--arm A --arm B)")
    names = [chr(ord("A") + i) for i in range(len(arms))]
    resolved = [resolve_arm(con, a) for a in arms]
    figures = [_arm_figures(con, ids) for ids in resolved]
    out = [
        "stallscope compare: "
        + "; ".join(f"{n} = runs {ids}" for n, ids in zip(names, resolved, strict=True))
        + "\n"
    ]
    rows = []
    for name, ids, (per_run, pauses, _, forced) in zip(names, resolved, figures, strict=True):
        n = len(ids)
        rows.append((f"{name}: knobs", _knobs(per_run)))
        if forced:
            rows.append((f"{name}: knob's own gc.collect()", f"{forced} gen-2 passes, left out"))
        rows.append((f"{name}: gen-2 passes in window", _per_run([r[1] for r in per_run], n)))
        if pauses:
            rows.append(
                (
                    f"{name}: gen-2 pause ms",
                    f"median {np.median(pauses):.3f}, max {max(pauses):.3f} over {len(pauses)} passes",
                )
            )
        else:
            rows.append((f"{name}: gen-2 pause ms", "no gen-2 pass"))
        rows.append((f"{name}: non-prefill steps > 100 ms", _per_run([r[2] for r in per_run], n)))
        rows.append(
            (f"{name}: steps > 100 ms, no GC overlap", _per_run([r[3] for r in per_run], n))
        )
    out.append("== Per arm ==\n" + format_table(["", "value"], rows))

    stages = sorted(set().union(*(f[2] for f in figures)))
    table = []
    for stage in stages:
        row = [stage or "(none)"]
        for _, _, by_stage, _ in figures:
            durations = by_stage.get(stage)
            if not durations:
                row.append("")
            elif len(durations) < 100:
                row.append(f"{np.quantile(durations, 0.99):.3f} (n={len(durations)}: too few)")
            else:
                est, lo, hi = _interval(durations, lambda v: np.quantile(v, 0.99))
                row.append(f"{est:.3f} [{lo:.3f}, {hi:.3f}]")
        table.append(tuple(row))
    out.append(
        "== p99 step ms per stage (95% bootstrap over the arm's steps) ==\n"
        + (format_table(["stage", *names], table) if table else "(no steps)\n")
    )
    a_pauses, b_pauses = figures[0][1], figures[1][1]
    if a_pauses and b_pauses:
        ratio = np.median(b_pauses) / np.median(a_pauses)
        a_n = np.mean([r[1] for r in figures[0][0]])
        b_n = np.mean([r[1] for r in figures[1][0]])
        out.append(
            f"B's median gen-2 pause is {ratio:.3f} x A's; B has {b_n:g} gen-2 passes per run "
            f"against A's {a_n:g}.\n"
        )
    out.append(_placement_per_run(con, names, resolved))
    return "\n".join(out)


def _placement_per_run(con, names, resolved):
    """Each arm's runs with where they ran (run_placement) and their median
    step: the run that stands out, and what it shared its CPU with."""
    rows = []
    for name, ids in zip(names, resolved, strict=True):
        for run_id in ids:
            p = con.execute(
                "SELECT cpu_time, sibling_busy_pct, cpu_node, mem_node, numa_remote, clock_mhz, "
                "hash_seed FROM run_placement WHERE run_id = ?",
                [run_id],
            ).fetchone()
            (median_ms,) = con.execute(
                "SELECT round(median(duration_ns) / 1e6, 3) FROM _step WHERE run_id = ? AND NOT idle",
                [run_id],
            ).fetchone()
            rows.append((name, run_id, median_ms, *(p or ("(not covered)",) + (None,) * 6)))
    return "== Placement per run ==\n" + format_table(
        ["arm", "run", "median step ms", "CPU time", "SMT sibling busy %", "CPU node",
         "memory node", "remote", "clock MHz", "hash seed"],
        rows,
    )  # fmt: skip
