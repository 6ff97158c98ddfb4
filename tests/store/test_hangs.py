"""The hang detector's rules on hand-made step batches (no daemon).

A run is hung once no step ended for longer than its threshold while its
last step was busy; an idle last step never makes one; the automatic
threshold is max(p99_factor x p99, minimum); an episode is reported once,
recovers at the next step end, and ends when the run leaves.
"""

import pyarrow as pa

from stallscope.store.hangs import HangDetector

S = 1_000_000_000


def steps(run_id, ends_s, dur_ms=5, batch=1, tid=7):
    n = len(ends_s)
    ends = [int(e * S) for e in ends_s]
    return pa.table(
        {
            "run_id": [run_id] * n,
            "tid": [tid] * n,
            "kind": ["step"] * n,
            "stage": [None] * n,
            "batch": [batch] * n,
            "start_ns": [e - dur_ms * 1_000_000 for e in ends],
            "end_ns": ends,
        }
    )


def detector(pids=None, **kw):
    pids = {1: 100} if pids is None else pids
    return HangDetector(lambda: pids, **kw), pids


def test_busy_run_hangs_once_and_recovers():
    d, _ = detector(min_threshold_ns=5 * S)
    d.on_batch("spans", steps(1, [1.0, 1.1, 1.2]))
    assert d.check(int(6.0 * S)) == ([], [])  # 4.8 s of silence: below 5 s
    started, ended = d.check(int(6.3 * S))
    assert [e.run_id for e in started] == [1] and ended == []
    assert started[0].threshold_ns == 5 * S and "minimum threshold" in started[0].reason
    assert d.check(int(7 * S)) == ([], [])  # one report per episode
    d.on_batch("spans", steps(1, [9.0]))
    started, ended = d.check(int(9.1 * S))
    assert started == [] and ended[0].recovered_ns == 9 * S
    assert d.hangs_total == 1 and d.recoveries_total == 1


def test_silence_is_judged_up_to_what_ingest_has_read():
    # The daemon's main loop read nothing for 3 s (starved at idle priority):
    # steps the client sent meanwhile may still be queued, so no hang yet.
    d, _ = detector(min_threshold_ns=1 * S)
    d.on_batch("spans", steps(1, [1.0, 1.1]))
    assert d.check(int(4.1 * S), seen_upto_ns=int(1.5 * S)) == ([], [])
    d.on_batch("spans", steps(1, [3.9]))  # read and decoded late: it kept working
    assert d.check(int(4.2 * S), seen_upto_ns=int(4.2 * S)) == ([], [])
    started, _ = d.check(int(6.0 * S), seen_upto_ns=int(5.0 * S))  # 1.1 s seen silent
    assert [e.run_id for e in started] == [1] and "1.1 s" in started[0].reason
    assert started[0].detected_ns == 6 * S  # the clock's time, not the watermark's


def test_an_idle_last_step_is_never_hung():
    d, _ = detector(min_threshold_ns=1 * S)
    d.on_batch("spans", steps(1, [1.0, 1.1]))
    d.on_batch("spans", steps(1, [1.2], batch=0))  # the engine went idle
    assert d.check(100 * S) == ([], [])
    d.on_batch("spans", steps(1, [101.0]))  # work again, then silence
    assert [e.run_id for e in d.check(103 * S)[0]] == [1]


def test_threshold_is_p99_factor_times_p99_above_the_minimum():
    d, _ = detector(min_threshold_ns=1 * S, p99_factor=10)
    d.on_batch("spans", steps(1, [i * 0.5 for i in range(1, 101)], dur_ms=200))
    watch = d.runs[1]
    threshold, how = d.threshold_for(watch)
    assert threshold == 2 * S and "p99" in how
    assert d.check(int((50 + 1.9) * S)) == ([], [])
    assert d.check(int((50 + 2.1) * S))[0]


def test_override_wins_and_a_run_that_leaves_ends_its_episode():
    d, pids = detector(min_threshold_ns=5 * S, threshold_ns=30 * S)
    d.set_override(1, S // 2)
    d.on_batch("spans", steps(1, [1.0]))
    started, _ = d.check(int(1.6 * S))
    assert started and "per-run threshold" in started[0].reason
    pids.clear()
    started, ended = d.check(2 * S)
    assert ended and ended[0].recovered_ns == 0 and d.recoveries_total == 0
    assert d.check(3 * S) == ([], [])


def test_other_tables_and_other_kinds_are_ignored():
    d, _ = detector(min_threshold_ns=S)
    t = steps(1, [1.0]).set_column(2, "kind", pa.array(["submit"]))
    d.on_batch("spans", t)
    d.on_batch("gc_events", steps(1, [1.0]))
    assert d.check(100 * S) == ([], []) and d.runs == {}


def test_the_fold_is_the_step_by_step_rule_on_mixed_batches():
    """_fold's numpy form gives what the per-step rule (rules.is_idle with
    the thread's batch reporting as of that step) gives, step by step."""
    import random

    import numpy as np

    from stallscope.store.hangs import RunWatch
    from stallscope.vocab import rules

    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(1, 30)
        tids = np.array([rng.choice([7, 8, 9]) for _ in range(n)])
        sizes = np.array([rng.choice([0, 0, 1, 4]) for _ in range(n)])
        marked = np.array([rng.random() < 0.2 for _ in range(n)])
        ends = np.array([rng.choice([10, 20, 30, 40]) * 1000 for _ in range(n)], dtype=np.int64)
        starts = ends - np.array([rng.randint(1, 9) for _ in range(n)], dtype=np.int64)
        seen = {rng.choice([7, 8])} if rng.random() < 0.5 else set()
        hung = rng.random() < 0.3
        got = RunWatch(1, last_end_ns=20_000, reports_batch=set(seen), hung_since_ns=hung)
        want = RunWatch(1, last_end_ns=20_000, reports_batch=set(seen), hung_since_ns=hung)
        HangDetector._fold(got, tids, sizes, marked, starts, ends)
        for i in range(n):  # the rule, one step at a time
            tid = int(tids[i])
            if sizes[i]:
                want.reports_batch.add(tid)
            idle = rules.is_idle(int(sizes[i]), bool(marked[i]), tid in want.reports_batch)
            if not idle:
                want.durations.append(int(ends[i] - starts[i]))
            if ends[i] >= want.last_end_ns:
                want.last_end_ns, want.last_idle = int(ends[i]), idle
            if want.hung_since_ns and not want.recovered_ns:
                want.recovered_ns = int(ends[i])
        assert got == want, (tids, sizes, marked, ends)


def test_next_due_says_when_the_first_run_could_be_hung():
    d, pids = detector(pids={1: 100, 2: 200}, min_threshold_ns=5 * S)
    d.check(int(1.0 * S))
    assert d.next_due_ns is None  # no step yet: nothing can hang
    d.on_batch("spans", steps(1, [1.0]))
    d.on_batch("spans", steps(2, [2.0]))
    d.check(int(3.0 * S))
    assert d.next_due_ns == 3 * S + 1  # run 1: 2 s silent of 5 s
    d.on_batch("spans", steps(1, [2.5], batch=0))  # run 1 idle: only run 2 counts
    d.check(int(3.0 * S))
    assert d.next_due_ns == 4 * S + 1
    started, _ = d.check(int(7.5 * S))
    assert [ep.run_id for ep in started] == [2] and d.next_due_ns == 0  # hung: every tick
