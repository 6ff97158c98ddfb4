"""A real PyTorch serving loop traced with no source edit: transformers' continuous batching.

`stallscope run --preset transformers -- python transformers_engine.py`
(stallscope/demo/transformers_engine.py, which imports nothing of ours)
against a real daemon: a tiny random-weight Llama (nothing downloaded), 30
requests as token ids arriving over 3 s through transformers' own
generation thread, scheduler and paged cache (the loop idles between
arrivals), with a helper thread building a heap of cycles so that gen-2
passes run during steps, on another thread than the step's. Needs the
`engines` extra (torch CPU, transformers): skipped without it, a failure in
CI (STALLSCOPE_REQUIRE_ENGINES=1). Runs in ~20 s on 2 cores.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.daemonproc import DaemonProcess
from helpers.engines import require_engines
from stallscope import demo

pytestmark = pytest.mark.daemon

ENGINE = str(Path(demo.__file__).resolve().parent / "transformers_engine.py")
SECONDS, RATE = 3, 10
REQUESTS = SECONDS * RATE
NEW_TOKENS = 12
MAX_PER_BATCH = 16  # the engine's ContinuousBatchingConfig


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    require_engines()
    tmp = tmp_path_factory.mktemp("hf")
    daemon = DaemonProcess(tmp).start()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        done = subprocess.run(
            [
                sys.executable, "-m", "stallscope.cli", "run",
                "--socket", daemon.socket, "--label", "hf-cb", "--preset", "transformers",
                "--", sys.executable, ENGINE,
                "--serve-seconds", str(SECONDS), "--rate", str(RATE),
                "--max-new-tokens", str(NEW_TOKENS),
                "--gc-pressure", "--exit-status", "7",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )  # fmt: skip
    finally:
        daemon.stop()
    assert done.stdout.strip(), done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    (run_id,) = daemon.query("SELECT run_id FROM runs WHERE label = 'hf-cb'")[0]
    return SimpleNamespace(daemon=daemon, done=done, summary=summary, run_id=run_id)


def test_every_request_finishes_and_the_exit_status_passes_through(hf_run):
    assert hf_run.done.returncode == 7, hf_run.done.stderr[-3000:]
    assert hf_run.summary["finished"] == REQUESTS
    assert hf_run.summary["tokens"] == REQUESTS * NEW_TOKENS
    assert "stallscope:" not in hf_run.done.stderr  # every preset target attached


def test_the_preset_attached_every_target(hf_run):
    events = hf_run.daemon.query(
        "SELECT kind, count(*) FROM run_events WHERE run_id = ? GROUP BY kind", [hf_run.run_id]
    )
    assert events == [("attached", 6)]  # work= and idle= included, the two request forms


def test_steps_and_their_batch_sizes_are_stored(hf_run):
    q = hf_run.daemon.query
    steps = q(
        "SELECT stage, batch, depth FROM spans WHERE run_id = ? AND kind = 'step' ORDER BY start_ns",
        [hf_run.run_id],
    )
    busy = [(stage, batch) for stage, batch, _ in steps if batch > 0]
    assert all(depth == 0 for _, _, depth in steps)
    # Every request needs NEW_TOKENS forwards; batches are real and bounded.
    assert len(busy) >= NEW_TOKENS
    assert 2 <= max(b for _, b in busy) <= MAX_PER_BATCH
    assert {stage for stage, _ in busy} == {"prefill", "decode"}
    # Idle iterations (no request ready: the loop waits for one) are batch 0,
    # marked idle, with no work; busy ones carry their work measure.
    idle = [stage for stage, batch, _ in steps if batch == 0]
    assert idle and set(idle) == {"idle"}
    marks = q(
        "SELECT batch > 0, idle, min(work), max(work) FROM spans "
        "WHERE run_id = ? AND kind = 'step' GROUP BY ALL ORDER BY 1",
        [hf_run.run_id],
    )
    assert [(busy, mark) for busy, mark, _, _ in marks] == [(False, True), (True, False)]
    assert marks[0][2:] == (0, 0) and marks[1][2] > 0
    # Nested spans: one schedule per iteration, one forward and update per busy one.
    kinds = dict(
        q("SELECT kind, count(*) FROM spans WHERE run_id = ? GROUP BY kind", [hf_run.run_id])
    )
    assert kinds["schedule"] == len(steps)
    assert kinds["forward"] == kinds["update"] == len(busy)
    # The step's batch is the batch its forward ran on.
    mismatched = q(
        "SELECT count(*) FROM spans s JOIN spans f ON f.run_id = s.run_id AND f.tid = s.tid "
        "AND f.kind = 'forward' AND f.start_ns >= s.start_ns AND f.end_ns <= s.end_ns "
        "WHERE s.run_id = ? AND s.kind = 'step' AND f.batch <> s.batch",
        [hf_run.run_id],
    )
    assert mismatched == [(0,)]


def test_every_finished_request_has_its_latency_on_the_engines_own_clock(hf_run):
    # The preset's request forms (add_request, and each token's
    # update_and_check_completion on the generation thread): every request
    # the engine finished has a row, its token count exact, its arrival,
    # first token and end within 1 ms of the engine's own timestamps.
    engine = hf_run.summary["per_request"]
    rows = hf_run.daemon.query(
        "SELECT r.text, l.arrival_ns, l.ttft_ns, l.e2e_ns, l.output_tokens, "
        "l.itl_max_ns, l.worst_step_idx FROM request_latency l JOIN requests r "
        "USING (run_id, request_id) WHERE l.run_id = ?",
        [hf_run.run_id],
    )
    got = {r[0]: r[1:] for r in rows}
    assert sorted(got) == sorted(engine), (sorted(got), sorted(engine))
    worst_us = [0, 0, 0]
    for rid, own in engine.items():
        arrival, ttft, e2e, tokens, itl_max, worst = got[rid]
        for i, (a, b) in enumerate(((arrival, own["arrival_ns"]),
                                    (arrival + ttft, own["first_token_ns"]),
                                    (arrival + e2e, own["last_token_ns"]))):  # fmt: skip
            worst_us[i] = max(worst_us[i], abs(a - b) / 1000)
    print(f"requests: {len(engine)}, worst us off the engine's clock (arrival, first "
          f"token, end): {worst_us}")  # fmt: skip
    for rid, own in engine.items():
        arrival, ttft, e2e, tokens, itl_max, worst = got[rid]
        assert tokens == own["tokens"] == NEW_TOKENS, (rid, tokens, own)
        assert abs(arrival - own["arrival_ns"]) <= 1_000_000, (rid, arrival, own)
        first = arrival + ttft
        assert abs(first - own["first_token_ns"]) <= 1_000_000, (rid, first, own)
        assert abs(arrival + e2e - own["last_token_ns"]) <= 1_000_000, (rid, e2e, own)
        # every gap between its tokens was a generation step's
        assert itl_max is not None and itl_max > 0 and worst is not None, (rid, itl_max, worst)
    served = hf_run.daemon.query(
        "SELECT count(*), count(step_idx) FROM request_steps WHERE run_id = ? AND event = 'token'",
        [hf_run.run_id],
    )
    assert served == [(REQUESTS * NEW_TOKENS, REQUESTS * NEW_TOKENS)], served


def test_every_gc_pass_is_stored_including_those_on_other_threads(hf_run):
    start_ns, end_ns = hf_run.summary["window_ns"]
    stored = dict(
        hf_run.daemon.query(
            "SELECT generation, count(*) FROM gc_events WHERE run_id = ? "
            "AND start_ns > ? AND end_ns < ? GROUP BY generation",
            [hf_run.run_id, start_ns, end_ns],
        )
    )
    assert [stored.get(g, 0) for g in range(3)] == hf_run.summary["gc_collections"]
    assert stored.get(2, 0) >= 1
    (step_tids,) = hf_run.daemon.query(
        "SELECT list(DISTINCT tid) FROM spans WHERE run_id = ? AND kind = 'step'", [hf_run.run_id]
    )[0]
    other = hf_run.daemon.query(
        "SELECT count(*) FROM gc_events WHERE run_id = ? AND NOT list_contains(?, tid)",
        [hf_run.run_id, step_tids],
    )
    assert other[0][0] > 0  # passes on the pressure thread, outside the step thread


def test_the_report_reads_the_run(hf_run):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stallscope.cli",
            "report",
            "--db",
            hf_run.daemon.db,
            "--run",
            str(hf_run.run_id),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "hf-cb" in done.stdout


def test_attribution_names_gc_stalls_and_keeps_idle_iterations_out(hf_run):
    """Issue 18 on the real loop: a step that a gen-2 pass (on another thread)
    stalled is a `gc` stall, idle iterations are never slow and never in a
    baseline, and the unexplained share of slow busy steps is printed."""
    q = hf_run.daemon.query
    idle_slow = q(
        "SELECT count(*) FROM step_attribution WHERE run_id = ? AND idle AND (slow OR cause IS NOT NULL)",
        [hf_run.run_id],
    )[0][0]
    assert idle_slow == 0
    n_idle = q("SELECT count(*) FROM step_attribution WHERE run_id = ? AND idle", [hf_run.run_id])[
        0
    ][0]
    assert n_idle > 0
    # Slow steps whose excess a gen-2 pass covers at least half of.
    stalled = q(
        "SELECT a.step_idx, a.cause, a.gc_ns, a.excess_ns FROM step_attribution a "
        "WHERE a.run_id = ? AND a.slow AND a.gc_generation = 2 AND a.gc_ns >= a.excess_ns / 2",
        [hf_run.run_id],
    )
    assert stalled, "no step was stalled by a gen-2 pass (the engine's --gc-pressure)"
    assert all(cause == "gc" for _, cause, _, _ in stalled), stalled
    causes = dict(
        q(
            "SELECT cause, count(*) FROM step_attribution WHERE run_id = ? AND slow GROUP BY cause",
            [hf_run.run_id],
        )
    )
    slow = sum(causes.values())
    print(
        f"transformers run: {slow} slow busy steps, causes {causes}, "
        f"unexplained {causes.get('unexplained', 0) / slow:.1%}"
    )
