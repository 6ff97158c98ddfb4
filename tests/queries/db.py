"""Small builders of test databases for the query tests (times in ms)."""

from helpers.schema_db import fresh_db

MS = 1_000_000


def new_db():
    con = fresh_db()
    return con


def add_run(con, run_id, pid, label=None):
    con.execute(
        "INSERT INTO runs (run_id, pid, label) VALUES (?, ?, ?)",
        [run_id, pid, label or f"run_{run_id:02d}"],
    )


def add_span(con, run_id, tid, kind, start_ms, end_ms, stage="recurrent", batch=4, depth=0):
    con.execute(
        "INSERT INTO spans (run_id, tid, kind, stage, batch, start_ns, end_ns, depth, seq) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
        [run_id, tid, kind, stage, batch, round(start_ms * MS), round(end_ms * MS), depth],
    )


def add_steps(con, run_id, tid, bounds_ms, stage="recurrent", batch=4):
    for s, e in bounds_ms:
        add_span(con, run_id, tid, "step", s, e, stage, batch)


def add_gc(con, run_id, tid, generation, start_ms, end_ms, collected=0):
    con.execute(
        "INSERT INTO gc_events (run_id, tid, generation, start_ns, end_ns, collected, uncollectable) "
        "VALUES (?, ?, ?, ?, ?, ?, 0)",
        [run_id, tid, generation, round(start_ms * MS), round(end_ms * MS), collected],
    )


def add_offcpu(con, pid, tid, start_ms, end_ms, preempted):
    con.execute(
        "INSERT INTO offcpu (pid, tid, start_ns, end_ns, preempted, cpu) VALUES (?, ?, ?, ?, ?, 0)",
        [pid, tid, round(start_ms * MS), round(end_ms * MS), preempted],
    )


def add_migrations(con, pid, tid, ts_ms_list):
    for i, ts in enumerate(ts_ms_list):
        con.execute(
            "INSERT INTO migrations (pid, tid, ts_ns, from_cpu, to_cpu) VALUES (?, ?, ?, ?, ?)",
            [pid, tid, round(ts * MS), i % 2, (i + 1) % 2],
        )


def attribution(con, where="TRUE"):
    cur = con.execute(
        f"SELECT * FROM step_attribution WHERE {where} ORDER BY run_id, tid, step_idx"
    )
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def normal_steps(start_ms, n, dur_ms=10, gap_ms=2):
    """n back-to-back steps of dur_ms, starting at start_ms."""
    return [
        (start_ms + i * (dur_ms + gap_ms), start_ms + i * (dur_ms + gap_ms) + dur_ms)
        for i in range(n)
    ]
