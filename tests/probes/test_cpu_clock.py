"""cpu_sample_clock = "auto": the CPU sampler's clock chosen by what its timer costs here.

The measurement (stallscope/probes/timer_cost.py) on this host's real perf
events: it runs on a thread of its own at idle priority, tells a timer that
costs a busy thread a lot (20 kHz) from one that costs nothing (1 Hz, the
control) through the same windows, and gives up at its deadline. The rule
that picks the clock from it, and a real daemon whose sampler chose its
clock this way: the status says what was measured and chosen, the
coverage rows carry the rate of the clock chosen, and the chosen clock
samples a traced engine.
"""

import os
import re
import threading

import pytest

from helpers import pythons
from helpers.cpu import CHAIN_S, Engine, chain_share, sampler_daemon
from helpers.privileged import is_root, require_privileged
from stallscope.probes import kernel_tick, timer_cost
from stallscope.probes.cpu_bcc import BccCpuProbe


def _measured(cost):
    return timer_cost.TimerCost(hz=1000.0, cost=cost, pairs=10, seconds=0.3)


def test_the_rule_takes_the_tick_only_where_the_timer_costs_more_than_allowed():
    allowed = timer_cost.MAX_TIMER_COST
    clock, why = timer_cost.choose(_measured(allowed * 5), None)
    assert clock == "tick" and "over the 2 % allowed" in why and "+10.0 %" in why, why
    clock, why = timer_cost.choose(_measured(allowed / 4), None)
    assert clock == "timer" and "within the 2 % allowed" in why and "+0.5 %" in why, why
    assert timer_cost.choose(_measured(allowed), None)[0] == "timer"  # at the line: the timer
    # not measured (refused, or past its deadline): the cheaper clock
    unknown = timer_cost.TimerCost(hz=1000.0, why="not done within 5 s, a busy host")
    clock, why = timer_cost.choose(unknown, None)
    assert clock == "tick" and "not measured: not done within 5 s" in why, why
    # no usable tick: the timer, whatever it costs, and why
    clock, why = timer_cost.choose(None, "no tick handler in /proc/kallsyms")
    assert clock == "timer" and "no tick handler in /proc/kallsyms" in why, why


def test_auto_is_the_default_and_a_choice_of_the_setting():
    from stallscope.probes.base import ProbeSettings

    assert ProbeSettings().cpu_sample_clock == "auto"
    with pytest.raises(ValueError, match="'auto', 'timer' or 'tick'"):
        BccCpuProbe(ProbeSettings(cpu_sample_clock="hrtimer"))


def _require_perf():
    require_privileged(is_root(), "perf events on another thread's clock need root here")


def test_the_measurement_runs_at_idle_priority_on_its_own_thread(monkeypatch):
    seen = {}

    def spy(hz, pairs, stop, result):
        seen["policy"] = os.sched_getscheduler(0)
        seen["thread"] = threading.current_thread().name
        result.cost, result.pairs = 0.001, pairs

    monkeypatch.setattr(timer_cost, "_measure_here", spy)
    got = timer_cost.measure(1000)
    assert seen == {"policy": os.SCHED_IDLE, "thread": "stallscope-timer-cost"}
    assert got.cost == 0.001 and got.pairs == timer_cost.PAIRS
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the caller's own policy untouched


@pytest.mark.privileged
def test_the_measurement_tells_a_costly_timer_from_a_free_one(monkeypatch):
    """The same windows with the event at 20 kHz (an interrupt every 50 us:
    costly anywhere) and at 1 Hz (none in a 15 ms window: the control)."""
    _require_perf()
    real_open = timer_cost._open_timer
    costs = {}
    for name, hz in (("costly", 20_000), ("control", 1)):
        monkeypatch.setattr(timer_cost, "_open_timer", lambda _hz, hz=hz: real_open(hz))
        m = timer_cost.measure(1000)
        assert m.cost is not None, m.why
        assert m.pairs == timer_cost.PAIRS and m.seconds < timer_cost.DEADLINE_S
        costs[name] = m.cost
    print(f"20 kHz {costs['costly'] * 100:+.1f} %, 1 Hz {costs['control'] * 100:+.1f} %")
    assert costs["costly"] > timer_cost.MAX_TIMER_COST, costs
    assert abs(costs["control"]) < timer_cost.MAX_TIMER_COST, costs


@pytest.mark.privileged
def test_a_measurement_past_its_deadline_is_no_figure_and_leaves_no_thread():
    _require_perf()
    m = timer_cost.measure(1000, deadline_s=0.01)
    assert m.cost is None and m.pairs == 0 and m.why == "not done within 0.01 s, a busy host"
    assert "stallscope-timer-cost" not in [t.name for t in threading.enumerate()]
    assert timer_cost.choose(m, None)[0] == "tick"


@pytest.mark.daemon
@pytest.mark.privileged
def test_a_daemon_on_auto_samples_with_the_clock_it_measured_for(tmp_path):
    """The daemon's sampler on "auto": its status and log say what the
    timer cost and which clock was taken; the coverage rows carry that
    clock's rate; a traced spinner is sampled with its whole chain."""
    daemon = sampler_daemon(tmp_path, "--cpu-sample-clock", "auto")
    try:
        chain = Engine(pythons.SYSTEM_PYTHON, daemon.socket, "chain", CHAIN_S).run()
    finally:
        rc, _ = daemon.stop(timeout_s=30)
    assert rc == 0, daemon.new_log()
    (detail,) = daemon.query(
        "SELECT detail FROM probe_status WHERE probe = 'cpu' AND state = 'active'"
    )[0]
    assert "auto chose the" in detail and "auto chose the" in daemon.read_log(), detail
    chose_tick = "auto chose the scheduler's tick" in detail
    cost = re.search(r"timer cost a busy thread ([+-][0-9.]+) %", detail)
    if cost:  # measured: the choice follows the figure
        assert chose_tick == (float(cost.group(1)) > timer_cost.MAX_TIMER_COST * 100), detail
    info, _ = kernel_tick.tick_info()
    hz = float(info.hz) if chose_tick else 1000.0
    assert daemon.query("SELECT DISTINCT sample_hz FROM coverage WHERE probe = 'cpu'") == [(hz,)]
    good, total, _ = chain_share(daemon, chain)
    assert total >= 0.3 * CHAIN_S * hz and good >= 0.95 * total, (good, total, detail)
