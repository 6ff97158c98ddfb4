"""A node's name in step_profile_diff when its steps tie: the node (a
function at one depth of the path) is reached through two lines, each step
of the group through one of them, with as many samples each. The view names
it after the lower frame id's line, every time: it once took whichever tied
row the aggregate saw first, so one report printed line 10 and the next, on
the same database, line 11.
"""

from db import add_run, new_db

# stack 201: Engine.step line 10 <- <module>; stack 202: the same function, line 11
FRAMES = """
INSERT INTO cpu_frames (frame_id, kind, file, function, line) VALUES
    (1, 'py', 'main.py', '<module>', 1),
    (2, 'py', 'engine.py', 'Engine.step', 10),
    (3, 'py', 'engine.py', 'Engine.step', 11);
INSERT INTO cpu_stacks (stack_id, depth, frame_id) VALUES
    (201, 0, 2), (201, 1, 1), (202, 0, 3), (202, 1, 1);
INSERT INTO coverage (run_id, probe, start_ns, end_ns, sample_hz) VALUES (1, 'cpu', 0, NULL, 1000);
"""


def tied_db(first_stack):
    """40 steps of 10 ms, 10 samples each, all on one stack per step: the
    steps through `first_stack` stored first."""
    con = new_db()
    add_run(con, 1, 100)
    con.execute(FRAMES)
    order = [first_stack, 403 - first_stack]
    con.execute(
        """INSERT INTO spans (run_id, tid, kind, stage, batch, start_ns, end_ns, depth, seq)
           SELECT 1, 11, 'step', 'decode', 4, i * 20000000, i * 20000000 + 10000000, 0, i
           FROM range(40) t(i)"""
    )
    for stack in order:
        con.execute(
            """INSERT INTO cpu_samples (pid, tid, ts_ns, cpu, stack_id, kernel_mode, unwind)
               SELECT 100, 11, i * 20000000 + k * 1000000 + 500000, 0, ?, false, NULL
               FROM range(40) t(i), range(10) r(k) WHERE i % 2 = ? ORDER BY i, k""",
            [stack, stack - 201],
        )
    return con


def names(con):
    return con.execute(
        "SELECT level, frame, normal_samples FROM step_profile_diff ORDER BY level"
    ).fetchall()


def test_a_node_whose_steps_tie_is_named_after_the_lower_frame_id():
    for first in (202, 201):
        con = tied_db(first)
        for _ in range(5):
            assert names(con) == [
                (0, "<module> (main.py:1)", 400),
                (1, "Engine.step (engine.py:10)", 400),
            ], f"stack {first} stored first"
