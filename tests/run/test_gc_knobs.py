"""`stallscope run --gc-freeze-after/--gc-threshold/--census`: the knobs take effect
in the traced process (read back there with gc.get_threshold and
gc.get_freeze_count), are recorded in `runs`, the freeze is a `gc_freeze`
run event, and the census brackets the run; a bad value is refused before
the command starts."""

import json
import re
import sys

import pytest

from helpers.run import stallscope_run, write_script

pytestmark = pytest.mark.daemon

APP = """
import gc, json, sys, time

class Leaf:
    pass

heap = [[Leaf()] for _ in range(20_000)]  # long-lived: frozen by the knob
# Wait for the freeze and the census after it (a condition, not a time):
# the probe's knob lock is held from the collect to that census.
probe = sys.modules["probe_client"]._autoattach._state["hooks"].probe
deadline = time.monotonic() + 60
while (gc.get_freeze_count() == 0 or probe._knob_lock.locked()) and time.monotonic() < deadline:
    time.sleep(0.02)
grown = [Leaf() for _ in range(3_000)]  # after the freeze: growth
print(json.dumps({"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def test_knobs_take_effect_and_are_recorded(daemon, engine_dir):
    script = write_script(engine_dir, "knobs.py", APP)
    done = stallscope_run(
        [
            "--socket",
            daemon.socket,
            "--label",
            "frozen",
            "--census",
            "--gc-freeze-after",
            "0.3",
            "--gc-threshold",
            "5000,20,30",
            "--",
            sys.executable,
            script,
        ],
        cwd=engine_dir,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["threshold"] == [5000, 20, 30]
    assert seen["frozen"] >= 40_000  # the heap's lists and leaves at least
    daemon.stop()
    row = daemon.query(
        "SELECT gc_freeze_after_s, gc_threshold_set, gc_threshold, census FROM runs "
        "WHERE label = 'frozen'"
    )
    assert row == [(0.3, [5000, 20, 30], [5000, 20, 30], True)]
    (message,) = daemon.query("SELECT message FROM run_events WHERE kind = 'gc_freeze'")[0]
    # The freeze count moves a little after the freeze (frozen objects die
    # of refcount; seen +2 once in a full-suite run): the three readings
    # (the event, the warm census, the engine's) agree within a few.
    frozen = int(re.search(r"freeze count (\d+)", message).group(1))
    phases = daemon.query("SELECT phase, freeze_count FROM heap_census_runs ORDER BY taken_ns")
    assert [p for p, _ in phases] == ["start", "warm", "close"]
    assert phases[0][1] == 0
    for reading in (phases[1][1], seen["frozen"]):
        assert abs(frozen - reading) <= 50, (frozen, phases, seen)
    growth = daemon.query(
        "SELECT from_phase, count_start, growth FROM heap_growth WHERE type_name = 'Leaf'"
    )
    # Counted from the census right after the freeze: the frozen leaves are
    # not in it, the 3,000 made after it are the growth.
    assert growth == [("warm", 0, 3_000)]


def test_bad_knob_values_are_refused_before_the_command_runs(engine_dir):
    for flag, value in (("--gc-threshold", "700,x"), ("--gc-freeze-after", "-1")):
        done = stallscope_run([flag, value, "--", sys.executable, "-c", "print('ran')"], engine_dir)
        assert done.returncode != 0
        assert "ran" not in done.stdout
        assert flag.lstrip("-").replace("-", "_") in done.stderr or value in done.stderr, (
            done.stderr
        )
