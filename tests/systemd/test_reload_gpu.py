"""SIGHUP changes a real probe's rate: a daemon process whose NVML is the fake
H200 (stallscope/testing/fake_nvml.py, through the real bindings) polls at 10 Hz,
the file is changed to 40 Hz and SIGHUP sent; the poll rows it stores after
the reload come at least twice as often as before, with no restart."""

import signal
import sys
import time

import pytest

from helpers.systemd import NotifyListener, ServiceProcess

pytestmark = pytest.mark.daemon

pytest.importorskip("pynvml")

WRAPPER = (
    "import sys\n"
    "from stallscope.testing import fake_nvml\n"
    "fake_nvml.install(fake_nvml.FakeNvml(gpus=1))\n"
    "from stallscope.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)

CONFIG = '[probes]\nsched_backend = "none"\ngpu_backend = "nvml"\ngpu_poll_hz = {hz}\n'


class FakeGpuService(ServiceProcess):
    def command(self):
        return [
            sys.executable,
            "-c",
            WRAPPER,
            "daemon",
            "--config",
            str(self.config),
            "--socket",
            self.socket,
            "--db",
            self.db,
        ] + self.args


def test_sighup_changes_the_gpu_poll_rate(tmp_path):
    lst = NotifyListener(path=tmp_path / "notify.sock")
    svc = FakeGpuService(tmp_path, CONFIG.format(hz=10), env={"NOTIFY_SOCKET": lst.address})
    svc.start()
    try:
        i = lst.wait_for("READY", "1")
        assert "gpu=nvml" in lst.messages[i][1]["STATUS"]
        time.sleep(2.5)
        svc.config.write_text(CONFIG.format(hz=40))
        pid = svc.proc.pid
        svc.signal(signal.SIGHUP)
        lst.wait_for("STATUS", after=i + 1, pred=lambda s: "gpu 40 Hz" in s)
        time.sleep(2.5)
        assert svc.proc.pid == pid and svc.proc.poll() is None
        assert svc.stop() == 0
    finally:
        svc.kill()
        lst.close()
    ((reload_ns, detail),) = svc.query(
        "SELECT ts_ns, detail FROM probe_status WHERE probe = 'gpu' AND detail LIKE 'reconfigured%'"
    )
    assert "gpu_poll_hz=40" in detail

    def polls(lo_ns, hi_ns):
        return svc.query(
            "SELECT count(*) FROM nvml_samples WHERE source = 'poll' AND ts_ns >= ? AND ts_ns < ?",
            [lo_ns, hi_ns],
        )[0][0]

    window = 2 * 10**9
    before = polls(reload_ns - window, reload_ns)
    after = polls(reload_ns + 2 * 10**8, reload_ns + 2 * 10**8 + window)
    assert before >= 5, before
    print(f"gpu poll rows in 2 s: {before} at 10 Hz, {after} at 40 Hz")
    assert after >= 2 * before, (before, after)
