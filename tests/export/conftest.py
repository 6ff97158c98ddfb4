"""Real traced runs for the export tests: a daemon process per host, each
tracing tests/export/fleet_engine.py over the real probe socket."""

import subprocess
import sys
from pathlib import Path

import pytest

from helpers.daemonproc import DaemonProcess

ENGINE = Path(__file__).with_name("fleet_engine.py")
# host name -> (steps, full GC every N steps, 5 ms sleep every N steps): two
# hosts with different GC and slow-step patterns.
HOSTS = {"gpu-a": (900, 90, 37), "gpu-b": (900, 30, 0)}


def run_engine(socket, label, steps, gc_every, sleep_every):
    subprocess.run(
        [sys.executable, str(ENGINE), socket, label, str(steps), str(gc_every), str(sleep_every)],
        check=True,
        timeout=300,
    )


def traced_database(tmp_path, label, shape, **daemon_kwargs):
    """A database holding one finished run of the engine (daemon stopped)."""
    daemon = DaemonProcess(tmp_path, **daemon_kwargs).start()
    try:
        run_engine(daemon.socket, label, *shape)
    finally:
        rc, _ = daemon.stop()
    assert rc == 0
    return daemon


@pytest.fixture(scope="package")
def fleet_dbs(tmp_path_factory):
    """host name -> stopped DaemonProcess whose database holds that host's run."""
    return {
        host: traced_database(tmp_path_factory.mktemp(host), host, shape)
        for host, shape in HOSTS.items()
    }
