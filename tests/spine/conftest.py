import pytest

from helpers.daemonproc import DaemonProcess


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProcess(tmp_path).start()
    yield d
    if d.proc.poll() is None:
        d.proc.kill()
        d.proc.wait()
