"""Two runs' per-step time, and whether a difference is placement or code.

`placement_section(con, a, b)` is the part of `stallscope compare` that
says where each run ran (the `run_placement` view: main CPU, SMT sibling
busy share, NUMA, clock, hash seed, affinity, cgroup limit) and, per
(stage, batch) both runs have, the ratio of median step times with a 95 %
bootstrap interval and a verdict: within noise (the interval holds 1), off
CPU (the extra time is not on-CPU time but the kernel saw it off CPU),
unseen (neither on nor off CPU as the guest saw it: host time), localized (one frame of the CPU
profile holds at least half the on-CPU excess beyond its share in the
faster run, by the `code` cause's binomial test) or uniform (every frame
kept its share: the same work ran slower, which is what a placement
difference does), with the placement differences beside it. It only reads.
"""

import math

import numpy as np

from stallscope.analysis.formatting import format_table

MIN_STEPS = 20  # per run and shape, for a ratio with an interval
BOOTSTRAP = 400
MAX_BOOTSTRAP_STEPS = 5000
SIBLING_POINTS = 10.0  # sibling busy shares this far apart (percentage points) differ
CLOCK_RATIO = 0.02


def _placement(con, run):
    cur = con.execute("SELECT * FROM run_placement WHERE run_id = ?", [run])
    row = cur.fetchone()
    return dict(zip([d[0] for d in cur.description], row, strict=True)) if row else None


def _fmt(v, unit=""):
    return "" if v is None else f"{v}{unit}"


def placement_differences(pa, pb):
    """Lines naming each placement difference between runs A and B."""
    if pa is None or pb is None:
        missing = " and ".join(n for n, p in (("A", pa), ("B", pb)) if p is None)
        return [f"no placement rows for {missing} (the placement probe did not cover it)"]
    out = []
    if (
        pa["main_cpu"] is not None
        and pb["main_cpu"] is not None
        and pa["main_cpu"] != pb["main_cpu"]
    ):
        out.append(
            f"main CPU: A cpu{pa['main_cpu']} ({pa['main_cpu_pct']}%), "
            f"B cpu{pb['main_cpu']} ({pb['main_cpu_pct']}%)"
        )
    sa, sb = pa["sibling_busy_pct"], pb["sibling_busy_pct"]
    if sa is not None and sb is not None and abs(sa - sb) >= SIBLING_POINTS:
        out.append(f"SMT sibling busy while on CPU: A {sa}%, B {sb}%")
    for name, p in (("A", pa), ("B", pb)):
        if p["numa_remote"]:
            out.append(
                f"NUMA: {name}'s memory is on node {p['mem_node']} ({p['mem_nodes']}), "
                f"its main CPU on node {p['cpu_node']} (remote)"
            )
    if pa["mem_node"] != pb["mem_node"] and not (pa["numa_remote"] or pb["numa_remote"]):
        if pa["mem_node"] is not None and pb["mem_node"] is not None:
            out.append(f"NUMA: memory on node {pa['mem_node']} (A), {pb['mem_node']} (B)")
    if pa["hash_seed"] != pb["hash_seed"] and None not in (pa["hash_seed"], pb["hash_seed"]):
        out.append(f"hash seed (PYTHONHASHSEED): A {pa['hash_seed']}, B {pb['hash_seed']}")
    elif pa["hash_seed"] == "random" and pb["hash_seed"] == "random":
        out.append("hash seed: random in both (dict and set layouts differ between them)")
    ca, cb = pa["clock_mhz"], pb["clock_mhz"]
    if ca and cb and abs(cb / ca - 1) >= CLOCK_RATIO:
        out.append(f"CPU clock: A {ca} MHz, B {cb} MHz")
    for key, what in (("affinity", "affinity"), ("cgroup_cpus", "cgroup CPU limit")):
        if pa[key] != pb[key]:
            out.append(f"{what}: A {_fmt(pa[key]) or 'none'}, B {_fmt(pb[key]) or 'none'}")
    return out


def _durations(con, run, stage, batch):
    return np.array(
        [
            r[0]
            for r in con.execute(
                "SELECT duration_ns FROM _step WHERE run_id = ? AND stage IS NOT DISTINCT FROM ? "
                "AND batch = ? AND NOT idle",
                [run, stage, batch],
            ).fetchall()
        ],
        dtype=np.float64,
    )


def median_ratio(da, db, seed=0):
    """B's median over A's, and a 95 % bootstrap interval of it."""
    rng = np.random.default_rng(seed)
    if len(da) > MAX_BOOTSTRAP_STEPS:
        da = rng.choice(da, MAX_BOOTSTRAP_STEPS, replace=False)
    if len(db) > MAX_BOOTSTRAP_STEPS:
        db = rng.choice(db, MAX_BOOTSTRAP_STEPS, replace=False)
    ratio = float(np.median(db) / np.median(da))
    ma = np.median(rng.choice(da, (BOOTSTRAP, len(da))), axis=1)
    mb = np.median(rng.choice(db, (BOOTSTRAP, len(db))), axis=1)
    lo, hi = np.quantile(mb / ma, [0.025, 0.975])
    return ratio, float(lo), float(hi)


def _profile(con, run, stage, batch):
    """({node: (samples, level, frame label)}, total samples, steps, period ns,
    median on-CPU ns, median off-CPU ns the kernel saw) of the run's non-idle
    steps of the shape; None without CPU samples."""
    steps, total, period, med_samples, med_off = con.execute(
        """SELECT count(*), sum(cpu_samples), any_value(cpu_sample_period_ns), median(cpu_samples),
                  median(gc_ns + coalesce(preempted_ns, 0) + coalesce(runq_ns, 0)
                         + coalesce(blocked_ns, 0) + coalesce(lock_ns, 0) + coalesce(peer_ns, 0)
                         + coalesce(throttled_ns, 0))
           FROM step_attribution WHERE run_id = ? AND stage IS NOT DISTINCT FROM ? AND batch = ?
             AND NOT idle AND cpu_samples IS NOT NULL""",
        [run, stage, batch],
    ).fetchone()
    if not steps or not total:
        return None
    period = period or 1_000_000
    nodes = con.execute(
        """
        WITH n AS (
            SELECT n.node, min(n.level) AS level, any_value(n.node_kind) AS kind,
                   arg_max(n.frame_id, n.samples) AS frame_id, arg_max(n.py_frame_id, n.samples) AS py_frame_id,
                   sum(n.samples) AS samples
            FROM _step_cpu_node n JOIN _step s USING (run_id, tid, step_idx)
            WHERE n.run_id = ? AND s.stage IS NOT DISTINCT FROM ? AND s.batch = ? AND NOT s.idle
            GROUP BY n.node)
        SELECT n.node, n.samples, n.level,
               _cpu_node_label(n.kind, f1.function, f1.file, f1.line, f2.function, f2.file, f2.line)
        FROM n LEFT JOIN cpu_frames f1 ON f1.frame_id = n.frame_id
        LEFT JOIN cpu_frames f2 ON f2.frame_id = n.py_frame_id""",
        [run, stage, batch],
    ).fetchall()
    nodes = {r[0]: (r[1], r[2], r[3]) for r in nodes}
    return nodes, total, steps, period, med_samples * period, med_off or 0


def localized_frame(fast, slow, z_min):
    """(frame, localized ns per step, on-CPU excess ns per step) of the deepest
    node of the slower run's profile holding at least half its on-CPU excess
    beyond its share in the faster one (z >= z_min); frame None: none does."""
    fn, fa, fsteps = fast[:3]
    sn, sa, ssteps, period = slow[:4]
    excess = (sa / ssteps - fa / fsteps) * period
    best = None
    for node, (b, level, label) in sn.items():
        share = (fn.get(node, (0,))[0] + 0.5) / (fa + 1)
        expect = sa * share
        z = (b - expect) / math.sqrt(max(sa * share * (1 - share), 1e-9))
        local = (b - expect) / ssteps * period
        if z >= z_min and excess > 0 and local >= 0.5 * excess:
            if best is None or level > best[0]:
                best = (level, label, local)
    return (best[1], best[2], excess) if best else (None, None, excess)


def verdict_for(wall, on_cpu, seen_off, frame, local, who):
    """The verdict of a difference outside noise: `wall` the median step
    difference, `on_cpu` that of the median on-CPU time, `seen_off` that of
    the median off-CPU time the kernel saw (ns); `frame`, `local` from
    localized_frame; `who` the slower run."""
    if on_cpu < 0.5 * wall:
        split = (f"of {who}'s +{wall / 1e6:.3f} ms per step, {max(on_cpu, 0) / 1e6:.3f} ms is "
                 f"on-CPU time, {max(seen_off, 0) / 1e6:.3f} ms off CPU as the kernel saw it")  # fmt: skip
        if seen_off >= 0.5 * (wall - max(on_cpu, 0)):
            return f"off CPU: {split} (the runs' causes say which)"
        return f"unseen: {split}; the rest is time neither saw (a host's steal, a vCPU descheduled)"
    if frame is not None:
        return (f"localized: {frame} holds {local / 1e6:.3f} ms per step beyond its share "
                f"({who}'s on-CPU time +{on_cpu / 1e6:.3f} ms per step)")  # fmt: skip
    return (f"uniform: {who}'s +{on_cpu / 1e6:.3f} ms of on-CPU time per step is spread over "
            "its frames as the other run spends its time (the same work ran slower: placement)")  # fmt: skip


def shape_verdicts(con, a, b):
    """Rows per (stage, batch) both runs have: steps, medians, ratio, interval, verdict."""
    (z_min,) = con.execute("SELECT code_z FROM step_params").fetchone()
    shapes = con.execute(
        """SELECT stage, batch FROM _step WHERE run_id IN (?, ?) AND NOT idle
           GROUP BY ALL HAVING count(DISTINCT run_id) = 2 ORDER BY ALL""",
        [a, b],
    ).fetchall()
    out = []
    for stage, batch in shapes:
        da, db = _durations(con, a, stage, batch), _durations(con, b, stage, batch)
        if min(len(da), len(db)) < MIN_STEPS:
            out.append((stage, batch, len(da), len(db), None, None, None,
                        f"too few steps for an interval (fewer than {MIN_STEPS})"))  # fmt: skip
            continue
        ratio, lo, hi = median_ratio(da, db)
        wall = abs(np.median(db) - np.median(da))
        if lo <= 1.0 <= hi:
            verdict = "within noise (the interval holds 1)"
        else:
            pa, pb = _profile(con, a, stage, batch), _profile(con, b, stage, batch)
            if pa is None or pb is None:
                verdict = "no CPU profile of both runs: uniform or localized cannot be told"
            else:
                fast, slow = (pa, pb) if ratio > 1 else (pb, pa)
                frame, local, excess = localized_frame(fast, slow, z_min)
                who = "B" if ratio > 1 else "A"
                # medians against the median difference: one statistic throughout
                verdict = verdict_for(wall, slow[4] - fast[4], slow[5] - fast[5], frame, local, who)
        out.append((stage, batch, len(da), len(db), round(ratio, 4),
                    f"{lo:.4f}-{hi:.4f}", round(wall / 1e6, 3), verdict))  # fmt: skip
    return out


def placement_section(con, a, b):
    """The compare report's placement part (text)."""
    pa, pb = _placement(con, a), _placement(con, b)
    cols = [("main CPU", "main_cpu", "cpu"), ("CPU time", "cpu_time", ""),
            ("SMT sibling busy %", "sibling_busy_pct", ""), ("CPU node", "cpu_node", ""),
            ("memory node", "mem_node", ""), ("clock MHz", "clock_mhz", ""),
            ("hash seed", "hash_seed", ""), ("affinity", "affinity", ""),
            ("cgroup CPUs", "cgroup_cpus", "")]  # fmt: skip
    rows = [
        (name, *(("" if p is None or p[key] is None else f"{pre}{p[key]}") for p in (pa, pb)))
        for name, key, pre in cols
    ]
    text = "== Placement ==\n" + format_table(["", "A", "B"], rows)
    reasons = {p["reasons"] for p in (pa, pb) if p and p["reasons"]}
    if reasons:
        text += "not known here: " + "; ".join(sorted(reasons)) + "\n"
    diffs = placement_differences(pa, pb)
    text += "Differences: " + ("; ".join(diffs) if diffs else "none the probe can see") + "\n"
    verdicts = shape_verdicts(con, a, b)
    text += "\n== Per-step time: placement or code ==\n"
    if not verdicts:
        return text + "(no stage and batch both runs have)\n"
    text += format_table(
        ["stage", "batch", "steps A", "steps B", "B / A", "95% interval", "|diff| ms", "verdict"],
        [(s or "", *rest) for s, *rest in verdicts],
    )
    return text
