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
