"""Requests in the Perfetto trace: a track per request under the run's
`requests` track, an instant per event, and a flow from each token event to
the step slice that held it (the same flow id on both), on a real daemon's
database of a small batching engine."""

import subprocess
import sys
import textwrap
from collections import Counter

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pt

from helpers.daemonproc import DaemonProcess

pytestmark = pytest.mark.daemon

ENGINE = textwrap.dedent(
    """
    import sys, time
    import probe_client
    probe = probe_client.connect(socket_path=sys.argv[1], run_label="served", gc=False)
    # request r arrives before step 2 r and gets a token in steps 2 r + 1 .. 2 r + 3
    # (3 tokens), then finishes; two requests in flight at a time
    for i in range(40):
        if i % 2 == 0 and i < 34:
            probe.request(f"req-{i // 2}", "arrived")
        t0 = probe.begin()
        time.sleep(0.001)
        for r in range(17):
            if 2 * r + 1 <= i <= 2 * r + 3:
                probe.request(f"req-{r}", "token", tokens=1)
        probe.end("step", t0, stage="decode", batch=2)
        for r in range(17):
            if i == 2 * r + 3:
                probe.request(f"req-{r}", "finished")
    probe.close()
    """
)


def test_request_tracks_and_flows_to_their_steps(tmp_path):
    d = DaemonProcess(tmp_path).start()
    try:
        subprocess.run([sys.executable, "-c", ENGINE, d.socket], check=True, timeout=60)
    finally:
        assert d.stop()[0] == 0
    path = tmp_path / "t.pftrace"
    out = subprocess.run(
        [sys.executable, "-m", "stallscope.cli", "export", "perfetto", "--db", d.db, "-o", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    trace = pt.Trace()
    trace.ParseFromString(path.read_bytes())
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in trace.packet
              if p.HasField("track_descriptor")}  # fmt: skip
    (root,) = [u for u, t in tracks.items() if t.name.startswith("requests (run ")]
    per_request = {u: t.name for u, t in tracks.items() if t.parent_uuid == root}
    assert sorted(per_request.values()) == sorted(f"request req-{r}" for r in range(17))
    flows_on = Counter()  # flow id -> events carrying it
    step_flows, token_flows = set(), set()
    instants = Counter()
    for p in trace.packet:
        if not p.HasField("track_event"):
            continue
        ev = p.track_event
        for f in ev.flow_ids:
            flows_on[f] += 1
        if ev.track_uuid in per_request and ev.type == pt.TrackEvent.TYPE_INSTANT:
            instants[ev.name] += 1
            token_flows.update(ev.flow_ids)
            assert (ev.name == "token") == bool(ev.flow_ids)
        elif ev.type == pt.TrackEvent.TYPE_SLICE_BEGIN and ev.name.startswith("step"):
            step_flows.update(ev.flow_ids)
    # 17 requests: arrived, 3 tokens (one per step), finished
    assert instants == {"arrived": 17, "token": 51, "finished": 17}
    assert token_flows == step_flows and len(token_flows) == 51
    assert set(flows_on.values()) == {2}  # each flow: its token and its step
