"""The CUDA driver components of step_attribution on a small fixture, one rule per step.

Run 1 (pid 100, thread 11): 30 normal 10 ms steps, each with a 6 ms
spinning sync (the baseline) and 20 launches in one summed row, and one
15 ms step (5 ms of excess) per case. The cuda probe and the sched probe
cover the run; NVML samples show the SM clock at 1800 MHz except under
step c5.
"""

import pytest

from helpers.schema_db import fresh_db
from stallscope.store import views

MS = 1_000_000

FIXTURE = """
INSERT INTO runs (run_id, pid, tid, label, started_ns) VALUES (1, 100, 11, 'engine', 0);
CREATE TEMP TABLE _s (s_ms DOUBLE, e_ms DOUBLE, sync_s DOUBLE, sync_e DOUBLE, launches INTEGER,
                      launch_ms DOUBLE);
INSERT INTO _s SELECT 1000 + 20 * i, 1010 + 20 * i, 1003 + 20 * i, 1009 + 20 * i, 20, 0.2
    FROM range(30) t(i);
INSERT INTO _s VALUES
    (200, 215, 203, 214, 20, 0.2),    -- c1: 11 ms sync, asleep 10.9 ms of it (a timer woke it)
    (220, 235, 223, 234, 20, 0.2),    -- c2: 11 ms sync, spinning
    (240, 255, 248, 254, 2000, 5.2),  -- c3: a launch storm of 2,000 launches, 5.2 ms
    (260, 275, 263, 274, 20, 0.2),    -- c4: 11 ms spinning sync, preempted 5 ms at its end
    (280, 295, 283, 294, 20, 0.2),    -- c5: 11 ms spinning sync under a dropped SM clock
    (300, 315, 303, 314, 20, 0.2);    -- c6: 11 ms spinning sync, preempted 3 ms in its middle
INSERT INTO spans (run_id, tid, kind, stage, batch, start_ns, end_ns, depth, seq)
SELECT 1, 11, 'step', 'decode', 4, (s_ms * 1e6)::BIGINT, (e_ms * 1e6)::BIGINT, 0,
       row_number() OVER (ORDER BY s_ms) FROM _s;
INSERT INTO cuda_calls (pid, tid, kind, name, start_ns, end_ns, count, total_ns, calls)
SELECT 100, 11, 'sync', 'cuStreamSynchronize', (sync_s * 1e6)::BIGINT, (sync_e * 1e6)::BIGINT, 1,
       ((sync_e - sync_s) * 1e6)::BIGINT, 1 FROM _s;
INSERT INTO cuda_calls (pid, tid, kind, name, start_ns, end_ns, count, total_ns, calls)
SELECT 100, 11, 'launch', NULL, ((s_ms + 0.5) * 1e6)::BIGINT,
       ((s_ms + 0.5 + launch_ms * 1.1) * 1e6)::BIGINT, launches, (launch_ms * 1e6)::BIGINT, launches
FROM _s;
DROP TABLE _s;
INSERT INTO offcpu (pid, tid, start_ns, end_ns, preempted, cpu, preemptor_pid, preemptor_tid,
                    preemptor_comm, waker_pid, waker_tid, waker_comm, waker_irq, wakeup_ns)
SELECT pid, tid, (s * 1e6)::BIGINT, (e * 1e6)::BIGINT, pre, 0, ppid, ppid, pcomm,
       NULL, NULL, NULL, wirq, (w * 1e6)::BIGINT FROM (VALUES
    (100, 11, 203.05, 213.95, false, NULL, NULL, true, 213.95),   -- c1: the sleeping sync
    (100, 11, 268.9, 273.9, true, 300, 'hog', NULL, NULL),       -- c4: sync returns 0.1 ms later
    (100, 11, 305, 308, true, 300, 'hog', NULL, NULL)            -- c6: the sync spun on after it
) t(pid, tid, s, e, pre, ppid, pcomm, wirq, w);
INSERT INTO nvml_samples (gpu, ts_ns, sm_clock_mhz, clock_event_reasons)
SELECT 0, (ts_ms * 1e6)::BIGINT, mhz, reasons FROM (VALUES
    (0, 1800, 0), (100, 1800, 0), (279, 900, 32), (296, 1800, 0), (400, 1800, 0), (900, 1800, 0),
    (1200, 1800, 0), (1500, 1800, 0)
) t(ts_ms, mhz, reasons);
INSERT INTO coverage (run_id, probe, start_ns, end_ns) VALUES
    (1, 'sched', 0, NULL), (1, 'cuda', 0, NULL);
"""


@pytest.fixture(scope="module")
def con():
    c = fresh_db()
    c.execute(FIXTURE)
    assert views.create_views(c) == []
    return c


def step(con, start_ms):
    cur = con.execute("SELECT * FROM step_attribution WHERE start_ns = ?", [start_ms * MS])
    cols = [d[0] for d in cur.description]
    (row,) = cur.fetchall()
    return dict(zip(cols, row, strict=True))


def test_baseline_steps_have_their_components_and_no_cause(con):
    r = step(con, 1000)
    assert not r["slow"] and r["cause"] is None
    assert r["cuda_sync_ns"] == 6 * MS and r["cuda_launches"] == 20
    assert r["cuda_sync_baseline_ns"] == 6 * MS and r["gpu_wait_ns"] == 0


def test_a_sleeping_sync_is_gpu_wait_not_blocked(con):
    r = step(con, 200)
    assert r["cause"] == "gpu_wait" and r["gpu_wait_ns"] == 5 * MS
    assert r["blocked_ns"] == 0


def test_a_spinning_sync_is_gpu_wait(con):
    r = step(con, 220)
    assert r["cause"] == "gpu_wait" and r["gpu_wait_ns"] == 5 * MS


def test_a_launch_storm_is_launch_with_every_launch_counted(con):
    r = step(con, 240)
    assert r["cause"] == "launch" and r["cuda_launches"] == 2000
    assert r["launch_ns"] == 5 * MS and r["cuda_launch_ns"] == round(5.2 * MS)


def test_a_preemption_the_sync_ended_right_after_stays_preemption(con):
    r = step(con, 260)
    assert r["cause"] == "preemption" and r["preempted_ns"] == 5 * MS
    assert r["gpu_wait_ns"] == 0  # 11 ms less 5 ms held is the baseline's 6 ms


def test_a_preemption_the_sync_outlasted_is_gpu_wait(con):
    r = step(con, 300)
    assert r["cause"] == "gpu_wait" and r["gpu_wait_ns"] == 5 * MS
    assert r["preempted_ns"] == 0


def test_gpu_wait_under_a_dropped_clock_is_gpu_clock(con):
    r = step(con, 280)
    assert r["cause"] == "gpu_clock" and r["sm_clock_min_mhz"] == 900
    assert r["gpu_wait_ns"] == 0 and r["gpu_clock_ns"] >= 5 * MS


def test_outside_cuda_coverage_the_components_are_null():
    c = fresh_db()
    c.execute(FIXTURE.replace("(1, 'cuda', 0, NULL)", "(1, 'cuda', 900000000, NULL)"))
    assert views.create_views(c) == []
    r = step(c, 220)
    assert r["cuda_sync_ns"] is None and r["gpu_wait_ns"] is None and r["launch_ns"] is None
    assert r["cause"] == "uncovered" and "cuda" in r["uncovered_probes"]
