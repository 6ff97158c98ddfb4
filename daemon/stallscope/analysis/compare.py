"""Compares two runs side by side, for questions such as "does gc.freeze()
after warm-up help?".

`compare_runs(con, run_a, run_b)` returns text: generation-2 count and
pauses, step p50/p99 per stage, steps over 100 ms, and per stage and batch
size the ratio of median step latency (B / A), then where each ran and
whether a difference is placement or code (compare_placement.py). Runs are
named by run_id or by label. It only reads the database.
"""

from stallscope.analysis.compare_placement import placement_section
from stallscope.analysis.formatting import format_table
from stallscope.errors import RunNotFound


def resolve_run(con, run):
    """A run_id from an id or a label; RunNotFound says what exists."""
    if isinstance(run, int) or (isinstance(run, str) and run.strip().isdigit()):
        rid = int(run)
        if con.execute(
            "SELECT 1 FROM runs WHERE run_id = ? UNION ALL "
            "SELECT 1 FROM spans WHERE run_id = ? LIMIT 1",
            [rid, rid],
        ).fetchone():
            return rid
    else:
        ids = [
            r[0]
            for r in con.execute(
                "SELECT run_id FROM runs WHERE label = ? ORDER BY run_id", [run]
            ).fetchall()
        ]
        if len(ids) == 1:
            return ids[0]
        if len(ids) > 1:
            raise RunNotFound(f"label {run!r} names runs {ids}: give a run_id instead")
    known = con.execute("SELECT run_id, label FROM runs ORDER BY run_id DESC LIMIT 10").fetchall()
    hint = ", ".join(f"{i}" + (f" ({lab})" if lab else "") for i, lab in known) or "none"
    raise RunNotFound(f"no run {run!r} in this database; latest runs: {hint}")


def _ratio(a, b):
    return round(b / a, 3) if a and b is not None else None


def compare_runs(con, run_a, run_b):
    """Side-by-side text comparison of two runs (ids or labels)."""
    a, b = resolve_run(con, run_a), resolve_run(con, run_b)
    label = dict(
        con.execute("SELECT run_id, label FROM runs WHERE run_id IN (?, ?)", [a, b]).fetchall()
    )
    name = {r: f"run {r}" + (f" ({label[r]})" if label.get(r) else "") for r in (a, b)}
    out = [f"stallscope compare: A = {name[a]}, B = {name[b]}\n"]

    runs = {
        r[0]: r[1:]
        for r in con.execute(
            """
        SELECT run_id, steps, long_steps, long_non_prefill, slow_steps, mean_step_ms,
               gen2_count, gen2_pause_ms, gen2_max_ms, gen1_count, gen0_count
        FROM seed_runs WHERE run_id IN (?, ?)""",
            [a, b],
        ).fetchall()
    }
    empty = (0, 0, 0, 0, None, 0, 0.0, None, 0, 0)
    ra, rb = runs.get(a, empty), runs.get(b, empty)
    names = [
        "steps",
        "steps > 100 ms",
        "  of which not prefill",
        "slow steps",
        "mean step ms",
        "gen-2 passes",
        "gen-2 pause total ms",
        "gen-2 pause max ms",
        "gen-1 passes",
        "gen-0 passes",
    ]
    rows = [
        (n, x, y, _ratio(x, y) if isinstance(x, (int, float)) else None)
        for n, x, y in zip(names, ra, rb, strict=True)
    ]
    out.append("== Overview ==\n" + format_table(["", "A", "B", "B / A"], rows))

    g2 = con.execute(
        """
        SELECT run_id, pause_ms, window_s, stage, step_ms FROM seed_gen2
        WHERE run_id IN (?, ?) ORDER BY run_id = ? DESC, gc_start_ns""",
        [a, b, a],
    ).fetchall()
    out.append(
        "== Generation-2 passes ==\n"
        + (
            format_table(
                ["run", "pause ms", "s into window", "stage", "step ms"],
                [("A" if r[0] == a else "B", *r[1:]) for r in g2],
            )
            if g2
            else "(none in either run)\n"
        )
    )

    stages = con.execute(
        """
        WITH s AS (
            SELECT run_id, stage, count(*) AS n,
                   quantile_cont(duration_ns, 0.5) / 1e6 AS p50, quantile_cont(duration_ns, 0.99) / 1e6 AS p99
            FROM _step WHERE run_id IN (?, ?) AND NOT idle GROUP BY run_id, stage)
        SELECT coalesce(x.stage, y.stage), x.n, y.n, round(x.p50, 3), round(y.p50, 3),
               round(x.p99, 3), round(y.p99, 3)
        FROM (SELECT * FROM s WHERE run_id = ?) x FULL JOIN (SELECT * FROM s WHERE run_id = ?) y
          ON x.stage IS NOT DISTINCT FROM y.stage
        ORDER BY 1""",
        [a, b, a, b],
    ).fetchall()
    out.append(
        "== Step latency per stage ==\n"
        + format_table(
            [
                "stage",
                "steps A",
                "steps B",
                "p50 A ms",
                "p50 B ms",
                "p50 B/A",
                "p99 A ms",
                "p99 B ms",
                "p99 B/A",
            ],
            [
                (s or "", na, nb, p50a, p50b, _ratio(p50a, p50b), p99a, p99b, _ratio(p99a, p99b))
                for s, na, nb, p50a, p50b, p99a, p99b in stages
            ],
        )
    )

    shapes = con.execute(
        """
        SELECT coalesce(x.stage, y.stage) AS stage, coalesce(x.batch, y.batch) AS batch,
               x.steps, y.steps, x.baseline_ns / 1e6, y.baseline_ns / 1e6
        FROM (SELECT * FROM step_baseline WHERE run_id = ?) x
        FULL JOIN (SELECT * FROM step_baseline WHERE run_id = ?) y
          ON x.stage IS NOT DISTINCT FROM y.stage AND x.batch = y.batch
        ORDER BY 1, 2""",
        [a, b],
    ).fetchall()
    both = [(s, bt, na, nb, ma, mb) for s, bt, na, nb, ma, mb in shapes if ma and mb]
    text = "== Median step latency per stage and batch ==\n" + format_table(
        ["stage", "batch", "steps A", "steps B", "median A ms", "median B ms", "B / A"],
        [(s or "", bt, na, nb, ma, mb, _ratio(ma, mb)) for s, bt, na, nb, ma, mb in shapes],
    )
    if both:
        # weighted by the smaller step count, so a shape seen once moves little
        import math

        wsum = sum(min(na, nb) for _, _, na, nb, _, _ in both)
        geo = math.exp(sum(min(na, nb) * math.log(mb / ma) for _, _, na, nb, ma, mb in both) / wsum)
        text += (
            f"Over the {len(both)} stage-and-batch shapes both runs have, B's median step is "
            f"{geo:.4f} x A's (geometric mean, weighted by the smaller step count).\n"
        )
    out.append(text)
    out.append(placement_section(con, a, b))
    return "\n".join(out)
