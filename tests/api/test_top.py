"""`stallscope top` against a real daemon, stdout not a terminal (snapshots)."""

import io
import re
import threading
import time

import pytest

import probe_client
from stallscope.api.v1 import stallscope_pb2 as pb
from stallscope.cli import top_screen as top

pytestmark = pytest.mark.daemon


def test_top_shows_stages_rates_and_stalls(api_daemon):
    out = io.StringIO()
    result = {}
    t = threading.Thread(
        target=lambda: result.setdefault(
            "rc", top.run(api_daemon.api_socket, duration_s=3.0, out=out)
        )
    )
    t.start()
    time.sleep(0.8)  # top connects and subscribes
    probe = probe_client.connect(socket_path=api_daemon.socket, run_label="top", gc=False)
    for i in range(150):
        t0 = probe.begin()
        time.sleep(0.002)
        probe.end("step", t0, stage="prefill" if i % 3 else "coda", batch=2)
    t0 = probe.begin()
    time.sleep(0.05)  # one step far above its baseline
    probe.end("step", t0, stage="prefill", batch=2)
    probe.close()
    t.join(30)
    assert result.get("rc") == 0
    text = out.getvalue()
    frames = text.split("--- ")
    assert len(frames) >= 2  # periodic snapshots, not one final print
    last = frames[-1]
    rows = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^(prefill|coda)\s+([\d.]+)\s+[\d.]+\s+[\d.]+", last, re.M)
    }
    assert set(rows) == {"prefill", "coda"} and rows["prefill"] > 0
    assert re.search(r"stalls .*: [1-9]\d* since start", last)
    assert "prefill/b2" in last and "x" in last


def test_dashboard_render_from_events():
    board = top.Dashboard()
    now = time.monotonic_ns()
    evs = [
        pb.Event(
            span=pb.Span(
                stage="recurrent",
                start_ns=now - (i + 1) * 1_000_000,
                end_ns=now - i * 1000,
                duration_ns=(i + 1) * 1_000_000,
            )
        )
        for i in range(100)
    ]
    evs.append(pb.Event(gc_pass=pb.GcPass(generation=2, end_ns=now, duration_ns=30_000_000)))
    evs.append(
        pb.Event(
            gpu_sample=pb.GpuSample(
                gpu=0,
                ts_ns=now,
                sm_clock_mhz=1410,
                mem_clock_mhz=2619,
                power_mw=300_000,
                temp_c=60,
                util_pct=99,
                clock_event_reasons=0x4 | 0x40,
            )
        )
    )
    evs.append(pb.Event(dropped=pb.Dropped(count=7, total=7)))
    board.add(pb.EventBatch(events=evs, sent_ns=now))
    frame = board.render(200)
    line = next(x for x in frame.splitlines() if x.startswith("recurrent"))
    assert line.split()[2:5] == ["50.00", "99.00", "100.00"]  # p50, p99, max (ms)
    assert "gen2: 1 passes, max 30.00 ms" in frame
    assert "SM 1410 MHz" in frame and "sw-power,hw-thermal" in frame
    assert "stream lost 7" in frame
