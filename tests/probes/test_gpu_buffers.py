"""The GPU probe's driver sample buffers and their clock calibration
(probes/gpu_buffers.py) against the fake H200 NVML, through the real
bindings and a real Store. No timing assertions."""

import time

import pytest

from helpers.gpu import make_probe, rows
from stallscope.testing import fake_nvml


def test_empty_sample_buffer_is_normal(fake, store):
    for g in fake.gpus:
        g.empty_buffers = True
    probe = make_probe(store)
    probe.poll()
    probe.read_buffers()
    probe.flush()
    assert fake.calls["nvmlDeviceGetSamples"] >= 4  # asked, answered NotFound
    assert rows(store, "SELECT source, count(*) FROM nvml_samples GROUP BY source") == [("poll", 2)]
    assert probe.sync is None and probe.counters["field_errors"] == 0
    assert rows(store, "SELECT count(*) FROM losses") == [(0,)]


def test_buffer_samples_carry_a_clock_dip_at_its_time(fake, store):
    probe = make_probe(store)
    now_us = fake.driver_clock_us()
    now_us -= now_us % fake.period_us  # on the buffer's sample grid
    fake.clock_episodes = [(now_us - 500_000, now_us - 300_000, 1095)]
    probe.gpus[0].last_seen_us.clear()  # re-read the whole buffer
    probe.read_buffers()
    probe.calibrate()
    probe.flush()
    dip = rows(
        store,
        "SELECT min(ts_ns), max(ts_ns), count(*) FROM nvml_samples "
        "WHERE source='buffer' AND gpu=0 AND sm_clock_mhz = 1095",
    )
    lo, hi, n = dip[0]
    assert n == 10  # 200 ms of 20 ms samples
    off = probe.sync["offset_ns"]
    assert lo == (now_us - 500_000) * 1000 - off
    assert hi == (now_us - 320_000) * 1000 - off


def test_calibration_of_an_unknown_driver_clock(store):
    # the driver clock is CLOCK_MONOTONIC + 123456.789 s: no known clock
    # matches, so the envelope of the reads must locate it, within its bound
    offset_ns = 123_456_789_000_000
    f = fake_nvml.FakeNvml(
        gpus=1,
        period_us=5_000,
        depth=50,
        driver_clock_us=lambda: (time.monotonic_ns() + offset_ns) // 1000,
    )
    undo = fake_nvml.install(f)
    try:
        probe = make_probe(store)
        for k in range(12):
            time.sleep(0.0017 * (k % 5 + 1))
            probe.read_buffers()
        sync = probe.calibrate()
        probe.flush()
    finally:
        undo()
    assert sync["clock"] == "envelope"
    assert sync["lower_ns"] <= offset_ns <= sync["upper_ns"]
    assert abs(sync["offset_ns"] - offset_ns) <= sync["err_ns"]
    assert sync["err_ns"] <= 5_000_000  # never worse than one sample period
    # a stored sample lands on CLOCK_MONOTONIC within the stated error
    for raw_us, ts_ns, err in rows(
        store,
        "SELECT raw_ts_us, ts_ns, sync_err_ns FROM nvml_samples "
        "WHERE source='buffer' ORDER BY ts_ns DESC LIMIT 5",
    ):
        assert abs(ts_ns - (raw_us * 1000 - offset_ns)) <= err
    assert rows(
        store, "SELECT clock, offset_ns FROM nvml_clock_sync ORDER BY ts_ns DESC LIMIT 1"
    ) == [("envelope", sync["offset_ns"])]


def test_calibration_identifies_a_realtime_driver_clock(fake, store):
    probe = make_probe(store)
    for _ in range(3):
        time.sleep(0.021)
        probe.read_buffers()
    sync = probe.calibrate()
    real = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns()
    assert sync["clock"] == "realtime"
    assert abs(sync["offset_ns"] - real) < 5_000_000  # both measured on this host
    assert sync["lower_ns"] - 50_000_000 <= sync["offset_ns"] <= sync["upper_ns"] + 50_000_000
    # integers only: a float here once made the store's batches disagree on a column type
    assert all(type(sync[k]) is int for k in ("offset_ns", "err_ns", "lower_ns", "upper_ns"))
    assert all(type(p) is int for g in probe.gpus for p in g.period_us.values())


def test_buffer_overrun_is_a_loss(store):
    f = fake_nvml.FakeNvml(gpus=1, period_us=1_000, depth=5)
    undo = fake_nvml.install(f)
    try:
        probe = make_probe(store, gpu_buffer_poll_s=5.0)
        # the probe shortened its buffer interval to half the buffer's span
        assert probe.buffer_poll_s == pytest.approx(0.1)  # clamped at one poll period
        time.sleep(0.05)  # 50 samples pass, the buffer holds 5
        probe.read_buffers()
        probe.flush()
    finally:
        undo()
    reasons = [r for (r,) in rows(store, "SELECT reason FROM losses")]
    assert "gpu0_sm_clock_mhz_buffer_overrun" in reasons
    assert probe.counters["buffer_overruns"] >= 1


def test_a_gap_in_a_partly_filled_buffer_is_not_a_loss(fake, store):
    probe = make_probe(store)
    now_us = fake.driver_clock_us()
    now_us -= now_us % fake.period_us
    # the driver took no sample for 300 ms (idle) right after our last read
    fake.sample_gaps = [(now_us - 600_000, now_us - 300_000)]
    for g in probe.gpus:
        for stype in g.last_seen_us:
            g.last_seen_us[stype] = now_us - 620_000
    probe.read_buffers()
    probe.flush()
    assert probe.counters["buffer_overruns"] == 0
    assert rows(store, "SELECT count(*) FROM losses") == [(0,)]
    n = rows(
        store,
        "SELECT count(*) FROM nvml_samples WHERE source='buffer' AND gpu=0 "
        "AND sm_clock_mhz IS NOT NULL AND raw_ts_us > ?",
        [now_us - 620_000],
    )
    assert n[0][0] >= 16  # now-300 ms .. now, none from the gap
