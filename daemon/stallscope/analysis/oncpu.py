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
from typing import NamedTuple

from stallscope.analysis.formatting import format_table

TOP_FRAMES = 8  # rows of the top-frames table per group
BUSY_GROUPS = 3  # groups (busiest by slow steps) that get a table and a flame graph


class ProfileRow(NamedTuple):
    """One node of a group's differential profile (step_profile_diff)."""

    node: int
    parent: int | None
    level: int
    slow_samples: int
    frame: str
    slow_pct: float | None
    normal_pct: float | None
    excess_ms: float | None
    z: float | None
    growth: float  # slow share - normal share (0 where absent)
    excess_ns: int | None


def _busy_groups(con, where):
    """[(run_id, baseline_group, slow steps, normal steps, [ProfileRow])] of
    the BUSY_GROUPS groups with the most slow steps. One query over
    step_profile_diff (each reading of the view costs ~1 s of planning and
    scans on a 40 s vLLM run's database: one per group was 4)."""
    rows = con.execute(
        f"""WITH d AS MATERIALIZED (
                SELECT * FROM step_profile_diff WHERE {where}
            ), g AS (
                SELECT run_id, baseline_group, any_value(slow_steps) AS slow,
                       any_value(normal_steps) AS normal
                FROM d WHERE slow_steps > 0 AND normal_steps > 0
                GROUP BY ALL ORDER BY 3 DESC, 1, 2 LIMIT {BUSY_GROUPS}
            )
            SELECT g.run_id, g.baseline_group, g.slow, g.normal,
                   d.node, d.parent, d.level, d.slow_samples, d.frame,
                   round(d.slow_share * 100, 1), round(d.normal_share * 100, 1),
                   round(d.excess_ns / 1e6, 3), d.z,
                   coalesce(d.slow_share, 0) - coalesce(d.normal_share, 0), d.excess_ns
            FROM g JOIN d USING (run_id, baseline_group)
            ORDER BY g.slow DESC, g.run_id, g.baseline_group, d.level, d.node"""
    ).fetchall()
    groups = {}
    for run_id, group, slow, normal, *profile in rows:
        groups.setdefault((run_id, group, slow, normal), []).append(ProfileRow(*profile))
    return [(*key, profile) for key, profile in groups.items()]


def oncpu_section(con, where):
    """The section's text ('' when no slow step had CPU samples)."""
    # The slow steps' on-CPU columns in one reading of step_attribution
    # (~0.7 s of planning and joins on a vLLM run's database: this section
    # read it five times). cause is NULL unless a step is slow.
    slow = con.execute(
        f"""SELECT cause, code_frame, code_ns, cpu_slow_evidence, cpu_slow_test,
                   cpu_samples IS NOT NULL
            FROM step_attribution WHERE {where} AND slow"""
    ).fetchall()
    if not any(sampled for *_, sampled in slow):
        return ""
    text = "== On CPU (the CPU sampler's view of slow steps) ==\n"
    code = {}
    for cause, frame, code_ns, *_ in slow:
        if cause == "code":
            n, ns = code.get(frame, (0, 0))
            code[frame] = (n + 1, ns + (code_ns or 0))
    if code:
        top = sorted(code.items(), key=lambda kv: (-kv[1][0], kv[0] is None, kv[0] or ""))
        text += "`code` steps by the frame holding their excess:\n"
        text += format_table(
            ["code_frame", "steps", "code ms"],
            [(f, n, round(ns / 1e6, 3)) for f, (n, ns) in top[:TOP_FRAMES]],
        )
    cpu_slow = [evidence for cause, _, _, evidence, *_ in slow if cause == "cpu_slow"]
    ev = {}
    for evidence in cpu_slow:
        for e in evidence or []:
            ev[e] = ev.get(e, 0) + 1
    text += f"`cpu_slow` steps: {len(cpu_slow):,}" + (
        " (evidence: "
        + ", ".join(f"{e} {n:,}" for e, n in sorted(ev.items(), key=lambda kv: (-kv[1], kv[0])))
        + "; a step may have several)"
        if ev
        else ""
    )
    text += ".\n"
    why = {}
    for cause, _, _, _, test, _ in slow:
        if cause == "unexplained":
            key = test or "not sampled"
            why[key] = why.get(key, 0) + 1
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
    for run_id, group, n_slow, normal, profile in _busy_groups(con, where):
        # level > 0, excess_ns > 0, by excess_ns DESC, frame
        growing = sorted(
            (p for p in profile if p.level > 0 and p.excess_ns is not None and p.excess_ns > 0),
            key=lambda p: (-p.excess_ns, p.frame),
        )[:TOP_FRAMES]
        if growing:
            text += f"run {run_id} group {group}: frames growing in {n_slow:,} slow against {normal:,} normal steps\n"
            text += format_table(
                ["frame", "slow %", "normal %", "excess ms", "z"],
                [(p.frame, p.slow_pct, p.normal_pct, p.excess_ms, p.z) for p in growing],
            )
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
    for run_id, group, slow, normal, profile in _busy_groups(con, where):
        nodes = {
            p.node: (p.parent, p.level, p.slow_samples, p.frame, p.growth)
            for p in profile
            if p.slow_samples > 0
        }
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
