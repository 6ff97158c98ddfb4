"""The causes of slow steps in a database, without and with the on-CPU causes `code` and `cpu_slow`.

For a database a traced engine was stored in (`stallscope demo --db X`,
`stallscope demo --engine transformers|vllm --db X`, or the daemon's file),
reads `step_attribution` twice on one copy of the file: with `code` and
`cpu_slow` switched off through their rule variables (`step_code_z` so high
that no frame's excess is significant, `step_cpu_slow_power` above 1, which
no test reaches: what the views named before the on-CPU causes) and with
the defaults. It prints, per arm, the slow steps, the unexplained share and
every cause's count, and for the defaults the `code` steps' frames and the
`cpu_slow` steps' evidence kinds. `--role` keeps the runs that reported that
role (the vLLM preset's `engine core`); `--label` those of a run label. The
copy gets this checkout's views. It measures; it asserts nothing.

    .venv/bin/python bench/oncpu_share.py --db X [--role "engine core"] [--label L]
"""

import argparse
from collections import Counter

from views_copy import role_runs, views_on_a_copy

ARMS = (
    ("without on-CPU causes", {"step_code_z": 1e9, "step_cpu_slow_power": 2.0}),
    ("with on-CPU causes (defaults)", {"step_code_z": None, "step_cpu_slow_power": None}),
)


def _runs(con, role, label):
    if role:
        return role_runs(con, role)
    sql = "SELECT run_id FROM runs" + (" WHERE label = ?" if label else "")
    return [r for (r,) in con.execute(sql, [label] if label else []).fetchall()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--role", help="only the runs that reported this role")
    ap.add_argument("--label", help="only the runs of this label")
    args = ap.parse_args()
    with views_on_a_copy(args.db) as con:
        runs = _runs(con, args.role, args.label)
        if not runs:
            raise SystemExit(
                f"{args.db}: no run matched (role {args.role!r}, label {args.label!r})"
            )
        (busy,) = con.execute(
            "SELECT count(*) FROM step_attribution WHERE list_contains(?, run_id) AND NOT idle",
            [runs],
        ).fetchone()
        print(f"runs {runs}: {busy} non-idle steps")
        for name, variables in ARMS:
            for var, value in variables.items():
                con.execute(
                    f"RESET VARIABLE {var}" if value is None else f"SET VARIABLE {var} = {value}"
                )
            rows = con.execute(
                "SELECT cause, code_frame, cpu_slow_evidence FROM step_attribution "
                "WHERE list_contains(?, run_id) AND slow",
                [runs],
            ).fetchall()
            causes = Counter(cause for cause, _, _ in rows)
            n = len(rows)
            un = causes.get("unexplained", 0)
            print(
                f"{name}: {n} slow steps, unexplained {un} ({un / max(n, 1):.1%}); "
                f"{dict(causes.most_common())}"
            )
        frames = Counter(frame for cause, frame, _ in rows if cause == "code")
        evidence = Counter(",".join(ev or ()) for cause, _, ev in rows if cause == "cpu_slow")
        print(f"  code frames: {dict(frames.most_common(8))}")
        print(f"  cpu_slow evidence: {dict(evidence.most_common())}")


if __name__ == "__main__":
    main()
