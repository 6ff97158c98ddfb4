"""Configuration: precedence (flags > environment > file > defaults), refusals
with line and reason, and SIGHUP on a real daemon: a rate changes live, a bad
file is refused while the daemon keeps running and serving."""

import signal
import time

import pytest

import probe_client
from helpers.systemd import REPO, NotifyListener, ServiceProcess, proc_backend_available
from stallscope.service import config

pytestmark = pytest.mark.daemon


def write(tmp_path, text, name="c.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_precedence_flags_env_file_defaults(tmp_path):
    path = write(
        tmp_path, "[probes]\ngpu_poll_hz = 20\nsched_poll_hz = 50\n[retention]\nmax_age_days = 7\n"
    )
    env = {"STALLSCOPE_GPU_POLL_HZ": "30", "STALLSCOPE_SCHED_POLL_HZ": "60"}
    cfg = config.resolve({"gpu_poll_hz": 40.0}, path, env)
    assert cfg["probes.gpu_poll_hz"] == 40.0 and cfg.sources["probes.gpu_poll_hz"] == "flag"
    assert cfg["probes.sched_poll_hz"] == 60.0 and cfg.sources["probes.sched_poll_hz"] == "env"
    assert cfg["retention.max_age_days"] == 7.0 and cfg.sources["retention.max_age_days"] == "file"
    assert cfg["retention.max_db_mb"] == 10240.0 and cfg.sources["retention.max_db_mb"] == "default"
    # $STALLSCOPE_CONFIG names the file when --config does not.
    cfg = config.resolve({}, None, {"STALLSCOPE_CONFIG": path})
    assert cfg["probes.gpu_poll_hz"] == 20.0 and cfg.path == path


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[probes]\nsched_poll_hz = 10\nbogus_rate = 3\n", ":3: unknown key probes.bogus_rate"),
        ("[probez]\nx = 1\n", ":1: unknown section [probez]"),
        ('[probes]\n\ngpu_poll_hz = "fast"\n', ":3: probes.gpu_poll_hz: expected a number"),
        ("[probes]\ngpu_poll_hz = 0\n", ":2: probes.gpu_poll_hz: 0 is below the minimum"),
        ('[probes]\nsched_backend = "ebpf"\n', "'ebpf' is not one of auto, bcc, perf, proc, none"),
        ("[retention]\nmax_db_mb = 5\n[probes\n", "line 3"),
        ('[api]\nlisten = "0.0.0.0:7000"\n', "without TLS: set api.tls_cert and api.tls_key"),
    ],
)
def test_bad_files_are_refused_with_line_and_reason(tmp_path, expected, text):
    path = write(tmp_path, text)
    with pytest.raises(config.ConfigError) as err:
        config.resolve({}, path, {})
    assert expected in str(err.value)
    assert path in str(err.value)


def test_bad_environment_is_refused():
    with pytest.raises(config.ConfigError, match="STALLSCOPE_MAX_DB_MB"):
        config.resolve({}, None, {"STALLSCOPE_MAX_DB_MB": "lots", "STALLSCOPE_CONFIG": ""})


def test_missing_explicit_file_is_an_error(tmp_path):
    with pytest.raises(config.ConfigError, match="cannot read"):
        config.resolve({}, str(tmp_path / "absent.toml"), {})


def test_shipped_config_is_the_documented_default():
    shipped = (REPO / "systemd" / "stallscope.toml").read_text()
    assert shipped == config.render_default_file()
    values = config.read_file(str(REPO / "systemd" / "stallscope.toml"))
    assert set(values) == set(config.BY_DOTTED)


def test_daemon_refuses_a_bad_file_at_start(tmp_path):
    svc = ServiceProcess(tmp_path, "[probes]\nsched_poll_hz = 10\nwhat = 1\n").start()
    rc = svc.proc.wait(timeout=30)
    assert rc == 2
    assert "unknown key probes.what" in svc.read_log()
    assert ":3:" in svc.read_log()


GOOD = (
    '[probes]\nsched_backend = "{backend}"\ngpu_backend = "none"\n'
    "sched_poll_hz = {hz}\ngpu_poll_hz = 10\n"
)


def test_sighup_changes_a_rate_and_refuses_a_bad_file(tmp_path):
    backend = "proc" if proc_backend_available() else "none"
    lst = NotifyListener(path=tmp_path / "notify.sock")
    svc = ServiceProcess(
        tmp_path, GOOD.format(backend=backend, hz=100), env={"NOTIFY_SOCKET": lst.address}
    ).start()
    try:
        i = lst.wait_for("READY", "1")
        assert "sched 100 Hz" in lst.messages[i][1]["STATUS"]

        # 1. A live change: the rate moves without a restart.
        svc.config.write_text(
            GOOD.format(backend=backend, hz=25) + "[daemon]\nallow_uids = [54321]\n"
        )
        svc.signal(signal.SIGHUP)
        j = lst.wait_for("STATUS", after=i + 1, pred=lambda s: "sched 25 Hz" in s)
        assert "RELOADING" in str(lst.messages[j - 1][1]) or any(
            "RELOADING" in m for _, m in lst.messages[i + 1 : j + 1]
        )
        svc.wait_log("configuration reloaded: probes.sched_poll_hz 100.0 -> 25.0")
        # Not live: reported, not applied (the probe client below is still accepted).
        svc.wait_log("daemon.allow_uids changed ([] -> [54321]) but needs a restart")
        pid = svc.proc.pid

        # 2. A bad file: refused with line and reason, old settings kept, still serving.
        svc.config.write_text(GOOD.format(backend=backend, hz=5) + "unknown_knob = 1\n")
        svc.signal(signal.SIGHUP)
        k = lst.wait_for("STATUS", after=j + 1, pred=lambda s: "NOT reloaded" in s)
        status = lst.messages[k][1]["STATUS"]
        assert "unknown key probes.unknown_knob" in status and ":6:" in status
        assert "sched 25 Hz" in status
        svc.wait_log("configuration NOT reloaded")
        assert svc.proc.poll() is None and svc.proc.pid == pid
        probe = probe_client.connect(socket_path=svc.socket, run_label="after-bad-reload", gc=False)
        for _ in range(100):
            probe.end("step", probe.begin())
        probe.close()
        time.sleep(0.5)
        assert svc.stop() == 0
    finally:
        svc.kill()
        lst.close()
    assert svc.query("SELECT count(*) FROM spans")[0][0] == 100
    assert svc.query("SELECT count(*) FROM runs WHERE label = 'after-bad-reload'") == [(1,)]
    if backend == "proc":
        rows = svc.query(
            "SELECT detail FROM probe_status WHERE probe = 'sched' AND detail LIKE 'reconfigured%'"
        )
        assert rows and "sched_poll_hz=25" in rows[0][0]


def test_no_implicit_config_file(tmp_path, monkeypatch):
    """Only --config or $STALLSCOPE_CONFIG name a file: defaults otherwise."""
    monkeypatch.chdir(tmp_path)
    cfg = config.resolve({}, None, {})
    assert cfg.path is None
    assert set(cfg.sources.values()) == {"default"}
