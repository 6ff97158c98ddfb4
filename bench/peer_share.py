"""The causes of one role's slow steps in a database, without and with peer spans.

For a database a multi-process engine was traced into (e.g. `stallscope demo
--engine vllm --db X`, or the daemon's file after `stallscope run --preset
vllm`), reads `step_attribution` for the runs that reported the role (the
vLLM preset's `engine core`) twice on one copy of the file: with peer spans
off (`step_peer_end_gap_ns` below zero: what the views named before run
groups) and with the defaults, and prints the slow steps' count, the
unexplained and peer shares and every cause's count for each. The copy gets
this checkout's views (the file keeps the ones it was written with). It
measures; it asserts nothing.

    .venv/bin/python bench/peer_share.py --db X [--role "engine core"]
"""

import argparse

from views_copy import role_runs, views_on_a_copy

ARMS = (("without peer spans", -1, 0.0), ("with peer spans (defaults)", None, None))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--role", default="engine core")
    args = ap.parse_args()
    with views_on_a_copy(args.db) as con:
        runs = role_runs(con, args.role)
        if not runs:
            raise SystemExit(f"{args.db}: no run reported the role {args.role!r}")
        busy, labelled = con.execute(
            "SELECT count(*), count(*) FILTER (stage IS NOT NULL AND work > 0) "
            "FROM step_attribution WHERE list_contains(?, run_id) AND NOT idle",
            [runs],
        ).fetchone()
        print(f"runs {runs} ({args.role}): {busy} non-idle steps, {labelled} with stage and work")
        for name, gap, share in ARMS:
            for var, value in (("step_peer_end_gap_ns", gap), ("step_peer_end_gap_share", share)):
                con.execute(
                    f"RESET VARIABLE {var}" if value is None else f"SET VARIABLE {var} = {value}"
                )
            causes = dict(
                con.execute(
                    "SELECT cause, count(*) FROM step_attribution "
                    "WHERE list_contains(?, run_id) AND slow GROUP BY cause ORDER BY 2 DESC",
                    [runs],
                ).fetchall()
            )
            n = sum(causes.values())
            un, peer = causes.get("unexplained", 0), causes.get("peer", 0)
            print(
                f"{name}: {n} slow steps, unexplained {un} ({un / max(n, 1):.1%}), "
                f"peer {peer} ({peer / max(n, 1):.1%}); {causes}"
            )


if __name__ == "__main__":
    main()
