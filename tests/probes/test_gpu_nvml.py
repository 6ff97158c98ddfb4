"""The GPU probe against a fake libnvidia-ml (H200 answers), through the real bindings.

`pynvml.nvmlLib` is replaced with stallscope.testing.fake_nvml.FakeNvml, so the
bindings' own marshalling and error mapping run (nvidia-ml-py 13.615.71 at
the time of writing; the project requires >= 12.535). Rows go through the
real Store into DuckDB and are asserted there. No timing assertions.
"""

import sys
import time
import types
from pathlib import Path

import pynvml
import pytest

from helpers.gpu import make_probe, rows
from stallscope.probes import gpu_nvml, nvml_bindings
from stallscope.probes.base import ProbeSettings
from stallscope.service.server import StoreSink
from stallscope.vocab.gpu_reasons import decode_clock_event_reasons, is_slowdown


def test_normal_readings_of_every_gpu(fake, store):
    probe = make_probe(store)
    probe.poll()
    probe.poll()
    probe.flush()
    got = rows(
        store,
        "SELECT gpu, sm_clock_mhz, graphics_clock_mhz, mem_clock_mhz, power_mw, "
        "power_source, temp_c, util_pct, mem_util_pct, clock_event_reasons, "
        "raw_ts_us IS NOT NULL, read_ns > 0 FROM nvml_samples "
        "WHERE source = 'poll' ORDER BY ts_ns",
    )
    assert len(got) == 4
    assert sorted({r[0] for r in got}) == [0, 1]
    assert set(got) == {
        (g, 1980, 1980, 3201, 612_000, "instant", 47, 98, 61, 0, True, True) for g in (0, 1)
    }
    ts = [
        r[0]
        for r in rows(store, "SELECT ts_ns FROM nvml_samples WHERE source='poll' ORDER BY ts_ns")
    ]
    now = time.monotonic_ns()
    assert all(0 < now - t < 60e9 for t in ts)  # CLOCK_MONOTONIC, not epoch
    assert rows(store, "SELECT state FROM probe_status WHERE probe='gpu'") == [("active",)]
    probe.stop()
    assert rows(store, "SELECT state FROM probe_status ORDER BY ts_ns")[-1] == ("stopped",)


def test_not_supported_fields_become_null_and_are_not_asked_again(fake, store):
    g = fake.gpus[0]
    g.unsupported = {"nvmlDeviceGetTemperature", "nvmlDeviceGetUtilizationRates"}
    g.instant_supported = False
    probe = make_probe(store)
    probe.poll()
    temp_calls = fake.calls.get("nvmlDeviceGetTemperature", 0)
    field_calls = fake.calls.get("nvmlDeviceGetFieldValues", 0)
    probe.poll()
    probe.flush()
    got = rows(
        store,
        "SELECT sm_clock_mhz, power_mw, power_source, temp_c, util_pct, mem_util_pct "
        "FROM nvml_samples WHERE source='poll' AND gpu=0",
    )
    assert got == [(1980, 598_000, "average", None, None, None)] * 2
    # GPU 1 still answers everything
    assert rows(
        store,
        "SELECT DISTINCT power_source, temp_c FROM nvml_samples WHERE source='poll' AND gpu=1",
    ) == [("instant", 47)]
    # the second poll asked GPU 0 neither for temperature nor for the instant field
    assert fake.calls["nvmlDeviceGetTemperature"] - temp_calls == 1  # GPU 1 only
    assert fake.calls["nvmlDeviceGetFieldValues"] - field_calls == 1
    assert probe.counters["field_errors"] == 0


def test_old_driver_without_event_reasons_uses_throttle_reasons(fake, store):
    fake.missing = {"nvmlDeviceGetCurrentClocksEventReasons"}
    for g in fake.gpus:
        g.reasons = 0x4
    probe = make_probe(store)
    probe.poll()
    probe.flush()
    assert rows(
        store, "SELECT DISTINCT clock_event_reasons FROM nvml_samples WHERE source='poll'"
    ) == [(4,)]
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2


def test_lost_gpu_is_recorded_and_retried(fake, store):
    probe = make_probe(store, gpu_retry_s=0.0)
    probe.poll()
    fake.gpus[0].lost = True
    probe.poll()
    probe.poll()  # retry fails: still lost
    assert probe.status()["lost"] == [0]
    fake.gpus[0].lost = False
    probe.poll()  # retry succeeds, reads again
    probe.flush()
    per_gpu = dict(
        rows(store, "SELECT gpu, count(*) FROM nvml_samples WHERE source='poll' GROUP BY gpu")
    )
    assert per_gpu == {0: 2, 1: 4}
    ((probe_, start, end, count, reason),) = rows(
        store, "SELECT probe, start_ns, end_ns, count, reason FROM losses"
    )
    assert probe_ == "gpu" and start < end and count >= 1
    assert reason.startswith("gpu0_lost") and "GPU is lost" in reason
    states = rows(store, "SELECT state, detail FROM probe_status ORDER BY ts_ns")
    assert [s for s, _ in states] == ["active", "failed", "active"]
    assert "retrying" in states[1][1] and "answers again" in states[2][1]
    assert probe.status()["lost"] == [] and probe.counters["recoveries"] == 1


def test_throttle_episode_is_decoded(fake, store):
    g = fake.gpus[0]
    probe = make_probe(store)
    probe.poll()
    g.sm_mhz, g.reasons = 1410, 0x4 | 0x40  # power cap + HW thermal
    probe.poll()
    g.sm_mhz, g.reasons = 1980, 0x0
    probe.poll()
    probe.flush()
    got = rows(
        store,
        "SELECT sm_clock_mhz, clock_event_reasons, "
        "gpu_clock_event_reason_names(clock_event_reasons), "
        "gpu_clock_event_is_slowdown(clock_event_reasons) "
        "FROM nvml_samples WHERE source='poll' AND gpu=0 ORDER BY ts_ns",
    )
    assert got == [
        (1980, 0, [], False),
        (1410, 0x44, ["sw_power_cap", "hw_thermal"], True),
        (1980, 0, [], False),
    ]


def test_poller_thread_runs_and_stops(fake, store):
    probe = gpu_nvml.NvmlGpuProbe(ProbeSettings(gpu_poll_hz=40, gpus=(1,)))
    probe.start(StoreSink(store))
    deadline = time.monotonic() + 10
    while probe.counters["polls"] < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    probe.stop()
    probe.stop()  # idempotent
    assert probe.counters["polls"] >= 3
    assert rows(store, "SELECT DISTINCT gpu FROM nvml_samples") == [(1,)]
    assert rows(store, "SELECT state FROM probe_status ORDER BY ts_ns")[-1] == ("stopped",)


def test_poll_rate_is_capped():
    probe = gpu_nvml.NvmlGpuProbe(ProbeSettings(gpu_poll_hz=1000))
    assert probe.poll_hz == gpu_nvml.MAX_POLL_HZ


def test_unavailable_without_a_driver(monkeypatch):
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        import ctypes

        ctypes.CDLL("libnvidia-ml.so.1")
        pytest.skip("this host has an NVIDIA driver")
    except OSError:
        pass
    reason = gpu_nvml.NvmlGpuProbe.unavailable(ProbeSettings())
    assert reason == (
        "no NVIDIA driver (libnvidia-ml.so.1 not found); the GPU probe is off, the daemon runs on"
    )


def test_unavailable_names_missing_gpus(fake):
    reason = gpu_nvml.NvmlGpuProbe.unavailable(ProbeSettings(gpus=(0, 5)))
    assert "GPU index [5] not present" in reason and "0..1" in reason
    assert gpu_nvml.NvmlGpuProbe.unavailable(ProbeSettings(gpus=(1,))) is None


def test_binding_checks():
    here = pynvml.__file__
    assert nvml_bindings.binding_problem(pynvml, "13.615.71", here) is None
    legacy = types.SimpleNamespace(__file__="/usr/lib/python3/site-packages/pynvml/__init__.py")
    msg = nvml_bindings.binding_problem(legacy, "13.615.71", here)
    assert "legacy 'pynvml'" in msg and "pip uninstall -y pynvml" in msg
    assert "too old" in nvml_bindings.binding_problem(pynvml, "12.520.1", here)
    assert "does not come from nvidia-ml-py" in nvml_bindings.binding_problem(pynvml, None, None)
    no_events = types.SimpleNamespace(__file__=here)
    assert "lacks" in nvml_bindings.binding_problem(no_events, "12.535.0", here)
    # and the installed bindings pass the whole check
    mod, problem = nvml_bindings.load_bindings()
    assert problem is None and mod is pynvml


def test_reason_decoder_agrees_with_sql(store):
    assert decode_clock_event_reasons(None) is None
    assert decode_clock_event_reasons(0) == []
    assert decode_clock_event_reasons(0x1) == ["idle"]
    assert decode_clock_event_reasons(0x600) == ["board_limit", "reliability"]
    assert decode_clock_event_reasons(0x801) == ["idle", "unknown_0x800"]
    assert is_slowdown(0x1) is False and is_slowdown(0x1 | 0x8) is True
    got = rows(
        store,
        "SELECT m, gpu_clock_event_reason_names(m::UBIGINT), "
        "gpu_clock_event_is_slowdown(m::UBIGINT) FROM range(2048) t(m) ORDER BY m",
    )
    assert len(got) == 2048
    for mask, names, slow in got:
        assert names == decode_clock_event_reasons(mask), mask
        assert slow == is_slowdown(mask), mask


def test_gpu_check_script_runs_against_the_fake(tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(pynvml, "nvmlLib", pynvml.nvmlLib)  # restored afterwards
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import gpu_check

    out = tmp_path / "gpu_check.json"
    try:
        assert gpu_check.main(["--fake", "--quick", "--out", str(out)]) == 0
    finally:
        pynvml._nvmlGetFunctionPointer_cache.clear()
    res = json.loads(out.read_text())
    assert res["gpu0"] == "NVIDIA H200" and res["fake"] is True
    lat = res["call_latency"]
    assert {
        "nvmlDeviceGetClockInfo(SM)",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetFieldValues(POWER_INSTANT)",
    } <= set(lat)
    assert all(v["errors"] == 0 and v["n"] > 0 for v in lat.values())
    assert res["buffers"]["processor_clock"]["period_us_median"] == 20_000
    assert res["buffers"]["processor_clock"]["depth"] == 100
    assert res["calibration"]["sync"]["clock"] == "realtime"
    assert res["field_timestamp_clock"]["matches"] == ["realtime"]
    assert res["poll_rate"]["default"]["achieved_hz"] > 0
    assert res["matmul"]["run"] is False and "not run" in res["matmul"]["why"]


def test_daemon_selects_and_runs_the_probe(fake, tmp_path):
    import duckdb

    from stallscope.service.server import Daemon

    d = Daemon(
        str(tmp_path / "probe.sock"),
        str(tmp_path / "d.duckdb"),
        sched_backend="none",
        settings=ProbeSettings(
            gpu_poll_hz=40,
            kernel_causes=False,
            cpu_sampler=False,
            cuda_driver=False,
            placement=False,
        ),
    )
    try:
        assert d.active_probes() == ["gpu=nvml"]
        gpu = d.probes[0]
        deadline = time.monotonic() + 10
        while gpu.counters["polls"] < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        d.shutdown()
    con = duckdb.connect(str(tmp_path / "d.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) >= 6 FROM nvml_samples WHERE source='poll'").fetchone() == (
        True,
    )
    assert con.execute(
        "SELECT count(*) > 0 FROM nvml_samples WHERE source='buffer'"
    ).fetchone() == (True,)
    assert con.execute("SELECT clock FROM nvml_clock_sync LIMIT 1").fetchone() == ("realtime",)
    states = con.execute(
        "SELECT state FROM probe_status WHERE probe='gpu' ORDER BY ts_ns"
    ).fetchall()
    assert states[-1] == ("stopped",) and ("active",) in states


def test_step_gpu_clock_view(store):
    ms = 1_000_000
    store.append(
        "spans",
        {
            "run_id": [1, 1, 1, 1],
            "tid": [7, 7, 7, 8],  # thread 8: a step inside thread 7's first
            "kind": ["step"] * 4,
            "stage": ["recurrent"] * 4,
            "batch": [8] * 4,
            "start_ns": [1000 * ms, 1010 * ms, 5000 * ms, 1001 * ms],
            "end_ns": [1004 * ms, 1013 * ms, 5003 * ms, 1003 * ms],
        },
    )
    # poll samples at 10 Hz: full clock, then a power-cap at 1000 ms
    store.append(
        "nvml_samples",
        {
            "gpu": [0, 0],
            "ts_ns": [900 * ms, 1000 * ms + 1],
            "source": ["poll", "poll"],
            "sm_clock_mhz": [1980, 1410],
            "clock_event_reasons": [0, 0x4],
        },
    )
    # driver-buffer samples every 20 ms: a dip to 1095 MHz at 1011 ms only
    store.append(
        "nvml_samples",
        {
            "gpu": [0, 0, 0],
            "ts_ns": [990 * ms, 1002 * ms, 1011 * ms],
            "source": ["buffer"] * 3,
            "sm_clock_mhz": [1980, 1980, 1095],
        },
    )
    got = rows(
        store,
        "SELECT start_ns // 1000000, gpu, min_sm_clock_mhz, max_sm_clock_mhz, "
        "clock_event_reasons, reason_names, slowdown, samples_inside, lead_ns "
        "FROM gpu_step_clock ORDER BY start_ns",
    )
    assert got == [
        # in force at start: poll 1980 (100 ms old), buffer 1980 (10 ms old);
        # inside: poll 1410 with sw_power_cap, buffer 1980
        (1000, 0, 1410, 1980, 4, ["sw_power_cap"], True, 2, 10 * ms),
        # thread 8: in force, poll 1410 + cap (1 ms old less 1 ns); inside: buffer 1980
        (1001, 0, 1410, 1980, 4, ["sw_power_cap"], True, 1, ms - 1),
        # in force: poll 1410 + cap (since 1000 ms), buffer 1980 (1002 ms); inside: the dip
        (1010, 0, 1095, 1980, 4, ["sw_power_cap"], True, 1, 8 * ms),
    ]  # the step at 5000 ms has no sample within 250 ms: no row


def test_gpu_check_matmul_phase_with_a_stand_in_torch(tmp_path, monkeypatch):
    # only the script's own logic (blocks, separate sampler process, figures):
    # a stand-in torch module whose "GPU" is a short sleep
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import gpu_check

    torch = types.ModuleType("torch")
    torch.bfloat16 = None
    torch.device = lambda name: name
    torch.randn = lambda *a, **k: object()
    torch.matmul = lambda a, b: None
    torch.cuda = types.SimpleNamespace(
        is_available=lambda: True,
        synchronize=lambda: time.sleep(0.001),
        get_device_name=lambda i: "stand-in",
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    res = gpu_check.matmul_effect(gpu_nvml, 0.2, 1, fake=True)
    assert res["run"] is True and res["device"] == "stand-in"
    for loop in ("big", "small"):
        assert {"off", "on_10hz", "on_50hz"} <= set(res[loop])
        assert res[loop]["off"]["steps"] > 10 and res[loop]["on_10hz"]["steps"] > 10
        assert res[loop]["off"]["median_vs_off"] == 1.0
    # the separate sampler process really polled
    assert all(hz > 0 for hz in res["small_sampler_hz_on_50hz"])
