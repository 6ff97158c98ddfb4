"""The report's on-CPU part: what the CPU sampler says about slow steps.

The `code` steps' frames (step_attribution.code_frame), the `cpu_slow`
steps by evidence kind, why the other open slow steps stayed `unexplained`
(too few samples to test, no evidence, a localized excess too small to
name), the frames whose share grows in each busy group's slow steps
(step_profile_diff), and a differential flame graph (PNG) of each: boxes as
wide as the slow steps' samples, red where a frame's share grew, blue where
it shrank. Nothing is printed for runs the sampler did not cover.
"""

import os

from stallscope.analysis.formatting import format_table

TOP_FRAMES = 8  # rows of the top-frames table per group
BUSY_GROUPS = 3  # groups (busiest by slow steps) that get a table and a flame graph


def _busy_groups(con, where):
    return con.execute(
        f"""SELECT run_id, baseline_group, any_value(slow_steps), any_value(normal_steps)
            FROM step_profile_diff WHERE {where} AND slow_steps > 0 AND normal_steps > 0
            GROUP BY ALL ORDER BY 3 DESC, 1, 2 LIMIT {BUSY_GROUPS}"""
    ).fetchall()


def oncpu_section(con, where):
    """The section's text ('' when no slow step had CPU samples)."""
    covered = con.execute(
        f"SELECT count(*) FROM step_attribution WHERE {where} AND slow AND cpu_samples IS NOT NULL"
    ).fetchone()[0]
    if not covered:
        return ""
    text = "== On CPU (the CPU sampler's view of slow steps) ==\n"
    code = con.execute(
        f"""SELECT code_frame, count(*), round(sum(code_ns) / 1e6, 3)
            FROM step_attribution WHERE {where} AND cause = 'code'
            GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT {TOP_FRAMES}"""
    ).fetchall()
    if code:
        text += "`code` steps by the frame holding their excess:\n"
        text += format_table(["code_frame", "steps", "code ms"], code)
    ev = con.execute(
        f"""SELECT e, count(*) FROM (SELECT unnest(cpu_slow_evidence) AS e FROM step_attribution
            WHERE {where} AND cause = 'cpu_slow') GROUP BY 1 ORDER BY 2 DESC, 1"""
    ).fetchall()
    n_slow = con.execute(
        f"SELECT count(*) FROM step_attribution WHERE {where} AND cause = 'cpu_slow'"
    ).fetchone()[0]
    text += f"`cpu_slow` steps: {n_slow:,}" + (
        " (evidence: " + ", ".join(f"{e} {n:,}" for e, n in ev) + "; a step may have several)"
        if ev
        else ""
    )
    text += ".\n"
    why = dict(
        con.execute(
            f"""SELECT coalesce(cpu_slow_test, 'not sampled'), count(*) FROM step_attribution
                WHERE {where} AND cause = 'unexplained' GROUP BY 1"""
        ).fetchall()
    )
    if why:
        names = {
            "few_samples": "too few samples to test",
            "no_evidence": "tested, no evidence the CPU gave less",
            "localized_excess": "a frame's share grew, too little to name",
            "not sampled": "outside the sampler's coverage",
        }
        text += (
            "`unexplained` steps: "
            + ", ".join(f"{names.get(k, k)} {n:,}" for k, n in sorted(why.items()))
            + ".\n"
        )
    for run_id, group, slow, normal in _busy_groups(con, where):
        rows = con.execute(
            f"""SELECT frame, round(slow_share * 100, 1), round(normal_share * 100, 1),
                       round(excess_ns / 1e6, 3), z
                FROM step_profile_diff
                WHERE run_id = ? AND baseline_group = ? AND level > 0 AND excess_ns > 0
                ORDER BY excess_ns DESC, frame LIMIT {TOP_FRAMES}""",
            [run_id, group],
        ).fetchall()
        if rows:
            text += f"run {run_id} group {group}: frames growing in {slow:,} slow against {normal:,} normal steps\n"
            text += format_table(["frame", "slow %", "normal %", "excess ms", "z"], rows)
    return text


def _layout(nodes):
    """x offsets of an icicle: each node's children side by side under it,
    widest first. nodes: {node: (parent, level, samples, ...)}."""
    kids = {}
    for node, (parent, *_rest) in nodes.items():
        kids.setdefault(parent, []).append(node)
    x = {}

    def place(node, at):
        x[node] = at
        for child in sorted(kids.get(node, []), key=lambda k: -nodes[k][2]):
            place(child, at)
            at += nodes[child][2]

    at = 0
    for root in sorted(kids.get(None, []), key=lambda k: -nodes[k][2]):
        place(root, at)
        at += nodes[root][2]
    return x


def flame_figures(con, where, out_dir):
    """One differential flame graph PNG per busy group; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for run_id, group, slow, normal in _busy_groups(con, where):
        rows = con.execute(
            """SELECT node, parent, level, slow_samples, frame,
                      coalesce(slow_share, 0) - coalesce(normal_share, 0)
               FROM step_profile_diff WHERE run_id = ? AND baseline_group = ? AND slow_samples > 0""",
            [run_id, group],
        ).fetchall()
        nodes = {r[0]: (r[1], r[2], r[3], r[4], r[5]) for r in rows}
        # a parent the slow steps never reached (only normal steps ran it) is no box
        nodes = {k: v if v[0] in nodes else (None, *v[1:]) for k, v in nodes.items()}
        if not nodes:
            continue
        x = _layout(nodes)
        total = sum(v[2] for v in nodes.values() if v[0] is None)
        depth = max(v[1] for v in nodes.values()) + 1
        fig, ax = plt.subplots(figsize=(11, 0.45 * depth + 1.5))
        for node, (_parent, level, samples, frame, growth) in nodes.items():
            # red: the frame's share grew in slow steps; blue: it shrank (full at +-25 points)
            g = max(-1.0, min(1.0, growth / 0.25))
            colour = (1.0, 1 - g, 1 - g) if g >= 0 else (1 + g, 1 + g, 1.0)
            ax.add_patch(
                plt.Rectangle((x[node], level), samples, 0.95, fc=colour, ec="0.3", lw=0.4)
            )
            if samples / total > 0.06:
                label = frame if len(frame) < 60 else frame[:57] + "..."
                ax.text(
                    x[node] + samples / 2,
                    level + 0.47,
                    label,
                    ha="center",
                    va="center",
                    fontsize=6,
                    clip_on=True,
                )
        ax.set_xlim(0, total)
        ax.set_ylim(0, depth)
        ax.set_yticks([])
        ax.set_xlabel(f"samples of the slow steps ({total:,})")
        ax.set_title(
            f"run {run_id} {group}: {slow:,} slow against {normal:,} normal steps "
            "(red: share grew, blue: shrank)",
            fontsize=9,
        )
        safe = "".join(c if c.isalnum() else "_" for c in group)
        path = os.path.join(out_dir, f"run_{run_id}_flame_{safe}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
