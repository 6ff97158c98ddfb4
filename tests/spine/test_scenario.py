"""The demo's serving engine: its shape, and the seed's GC effect on demand."""

import os
import subprocess
import sys

import pytest

from stallscope.demo import engine as eng

pytestmark = pytest.mark.daemon


def test_request_walks_the_recurrent_depth_stages():
    r = eng.Request(0, 0.0)
    seen = []
    while not r.done:
        seen.append(r.phase)
        r.advance()
    assert seen[0] == "prefill"
    first = seen[1 : 1 + 1 + eng.FIRST_TOKEN_LOOPS + 1]
    assert first == ["prelude"] + ["recurrent"] * eng.FIRST_TOKEN_LOOPS + ["coda"]
    later = seen[len(first) + 1 : len(first) + 1 + eng.LATER_TOKEN_LOOPS + 2]
    assert later == ["prelude"] + ["recurrent"] * eng.LATER_TOKEN_LOOPS + ["coda"]
    assert seen.count("coda") == eng.OUTPUT_TOKENS


def test_schedule_is_fcfs_by_stage_with_prefill_first():
    engine = eng.Engine.__new__(eng.Engine)
    engine.waiting, engine.running = __import__("collections").deque(), []
    a, b, c = (eng.Request(i, 0.0) for i in range(3))
    a.phase, b.phase = "recurrent", "coda"
    engine.running = [a, b]
    engine.waiting.append(c)
    batch = engine._schedule()
    assert (batch.phase, [r.rid for r in batch.requests]) == ("prefill", [2])
    c.phase = "recurrent"
    batch = engine._schedule()
    assert (batch.phase, sorted(r.rid for r in batch.requests)) == ("recurrent", [0, 2])


def _run(daemon, *args, duration=14):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "stallscope.demo.scenario",
            daemon.socket,
            "--duration",
            str(duration),
            "--warmup",
            "3",
            *args,
        ],
        check=True,
        env=env,
        timeout=120,
    )
    assert daemon.stop()[0] == 0


def test_gc_pressure_makes_a_gen2_pause_stall_a_step(daemon):
    _run(daemon, "--gc-pressure", "--label", "leaky")
    steps = daemon.query(
        "SELECT stage, count(*), median(end_ns - start_ns) FROM spans "
        "WHERE kind = 'step' GROUP BY stage"
    )
    by_stage = {s: (n, med / 1e6) for s, n, med in steps}
    assert set(by_stage) == {"prefill", "prelude", "recurrent", "coda"}
    for stage in ("prelude", "recurrent", "coda"):
        assert 2.0 < by_stage[stage][1] < 20.0, by_stage  # ~4-7 ms; generous on a busy box
    assert by_stage["prefill"][1] > 3 * by_stage["recurrent"][1]
    gen2 = daemon.query("""
        SELECT g.end_ns - g.start_ns, s.end_ns - s.start_ns, s.stage
        FROM gc_events g JOIN spans s ON s.run_id = g.run_id AND s.kind = 'step'
         AND g.start_ns < s.end_ns AND s.start_ns < g.end_ns
        WHERE g.generation = 2 AND g.start_ns > (SELECT min(start_ns) FROM spans
                                                 WHERE kind = 'window')""")
    assert len(gen2) >= 1
    pause_ns, step_ns, stage = gen2[0]
    assert step_ns >= pause_ns
    assert step_ns > 3 * by_stage[stage][1] * 1e6  # the overlapped step stands out


def test_without_gc_pressure_no_gen2_in_steady_state(daemon):
    _run(daemon, "--label", "clean", duration=10)
    assert daemon.scalar("SELECT count(*) FROM spans WHERE kind = 'step'") > 300
    assert (
        daemon.scalar("""
        SELECT count(*) FROM gc_events WHERE generation = 2
          AND start_ns > (SELECT min(start_ns) FROM spans WHERE kind = 'window')""")
        == 0
    )
