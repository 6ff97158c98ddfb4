"""What `cpu_sample_clock = "auto"` measures here, and how steadily: its choice's spread.

Runs the daemon's own measurement (stallscope/probes/timer_cost.py: a
thread at idle priority, windows of cache-touching work with a per-thread
cpu-clock event switched on in every other one) ROUNDS times at each rate:
the sampler's default 1 kHz, 250 Hz, and two references through the same
windows, a 1 Hz event (the control: no interrupt in a 15 ms window) and 20
kHz. Prints each rate's costs, their median, the time each measurement
took and the clock "auto" would take from each. Root (perf events). It
measures; it asserts nothing.

    .venv/bin/python bench/clock_choice.py [ROUNDS]
"""

import statistics
import sys

from stallscope.probes import timer_cost


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    real_open = timer_cost._open_timer
    for label, hz, event_hz in (
        ("1 kHz", 1000, 1000),
        ("250 Hz", 250, 250),
        ("control: 1 Hz event in 1 kHz windows", 1000, 1),
        ("20 kHz event in 1 kHz windows", 1000, 20_000),
    ):
        timer_cost._open_timer = lambda _hz, e=event_hz: real_open(e)
        runs = [timer_cost.measure(hz) for _ in range(rounds)]
        timer_cost._open_timer = real_open
        costs = [r.cost for r in runs if r.cost is not None]
        chose = [timer_cost.choose(r, None)[0] for r in runs]
        secs = [r.seconds for r in runs]
        print(
            f"{label}: cost median {statistics.median(costs) * 100:+.2f} % "
            f"(runs {', '.join(f'{c * 100:+.1f}' for c in costs)}; "
            f"{rounds - len(costs)} not measured), took {statistics.median(secs):.2f} s "
            f"(max {max(secs):.2f}), auto would take: "
            f"tick {chose.count('tick')}, timer {chose.count('timer')}",
            flush=True,
        )


if __name__ == "__main__":
    main()
