"""The CPU sampler on a host whose CPUs are all busy: a traced spinner, then
one nice-0 CPU hog per CPU beside it, for 10 s.

The daemon's readers run at idle priority, so on such a host they get a CPU
rarely: a reader that falls behind must raise itself before its ring fills
(threads.keep_up), because the main loop that would raise it is itself at
idle priority while its clients send slowly. The hogs start once the
spinner is sampled: a client that connects while they run is accepted
after 0.1-2.5 s here, and in 1 run of 12 only after its 10 s run had ended
(the interpreter lock, docs/footprint.md "Blind spots"), so that case is
not asserted. That the main loop's calls never wait for a drain is
tests/probes/test_reader_locks.py.
"""

import os
import subprocess
import sys
import time

import pytest

from helpers import pythons
from helpers.cpu import Engine, chain_share
from helpers.daemonproc import DaemonProcess
from helpers.privileged import is_root, require_privileged
from stallscope.probes.cpu_bcc import BccCpuProbe
from stallscope.probes.sched_bcc import BccSchedProbe

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

SPIN_S = 10


def test_a_spinner_beside_cpu_hogs_is_sampled_with_its_frames_and_nothing_lost(tmp_path):
    why = BccCpuProbe.unavailable() or BccSchedProbe.unavailable()
    require_privileged(is_root() and why is None, f"requires root and bcc: {why}")
    # the default probes (the scheduling probe's reader too) and the sampler
    # at 1 kHz
    daemon = DaemonProcess(
        tmp_path, sched_backend="bcc", extra_args=["--cpu-sampler", "--cpu-sample-clock", "timer"]
    ).start(timeout_s=90)
    hogs, engine = [], None

    def start_hogs():
        hogs.extend(
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 2)
        )

    try:
        engine = Engine(pythons.SYSTEM_PYTHON, daemon.socket, "chain", SPIN_S)
        ready = engine.expect("ready")
        engine.proc.stdin.write("\n")
        engine.proc.stdin.flush()
        spinner = engine.expect("spinner")
        time.sleep(1.5)  # its layout report taken on a quiet host
        start_hogs()
        engine.expect("done")
        engine.proc.wait(30)
        run = {"ready": ready, "spinner": spinner}
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        if engine is not None and engine.proc.poll() is None:
            engine.proc.kill()
        rc, _ = daemon.stop(timeout_s=60)
    assert rc == 0, daemon.new_log()
    lost = daemon.query("SELECT reason, sum(count) FROM losses WHERE probe = 'cpu' GROUP BY ALL")
    assert not [r for r in lost if "ring full" in r[0]], lost
    good, total, lead_s = chain_share(daemon, run)
    assert lead_s <= 3.0, (lead_s, lost)  # as test_cpu_bcc: a loaded host
    # a third of a CPU at least (three busy threads on two CPUs: ~2/3) at 1 kHz
    first_ns, n = daemon.query(
        "SELECT min(ts_ns), count(*) FROM cpu_samples WHERE pid = ? AND tid = ?",
        [ready["pid"], spinner["tid"]],
    )[0]
    late_s = (first_ns - spinner["t"]) / 1e9
    assert total > SPIN_S * 1000 / 3, (total, n, late_s, daemon.new_log()[-3000:])
    assert good >= 0.95 * total, (good, total)
