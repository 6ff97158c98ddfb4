"""The unit files as systemd reads them: `systemd-analyze verify` on a staged
install, the `systemd-analyze security --offline=true` exposure score against
the measured figure, the capability allow-list, the socket unit, and
install.sh / --uninstall into a temporary root."""

import os
import re
import subprocess

import pytest

from helpers.systemd import REPO, have
from stallscope.service.systemd import activation

INSTALL = str(REPO / "scripts" / "install.sh")
UNITDIR = "usr/local/lib/systemd/system"
VENV = REPO / ".venv"
# Measured with systemd 252 (docs/systemd.md): 1.6. A change that raises it
# must be argued in the docs and this figure updated with it.
MEASURED_EXPOSURE = 1.6
EXPOSURE_MARGIN = 0.2
# Measured (docs/systemd.md): what the bcc, perf and NVML probes need, no more.
CAPABILITIES = {"CAP_BPF", "CAP_PERFMON", "CAP_DAC_READ_SEARCH"}

needs_analyze = pytest.mark.skipif(
    not have("systemd-analyze"), reason="needs systemd-analyze (Debian package systemd)"
)


def unit(name):
    """A unit file as {section: {key: [values]}} (keys may repeat)."""
    parsed = {}
    section = None
    for line in (REPO / "systemd" / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = parsed.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        section.setdefault(key, []).append(value)
    return parsed


def install(root, *args):
    out = subprocess.run(
        [INSTALL, "--root", str(root), *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr + out.stdout
    return out.stdout + out.stderr


@pytest.fixture
def staged(tmp_path):
    """Units installed under a temp root, running the dev venv's real command."""
    root = tmp_path / "root"
    log = install(root, "--venv", str(VENV))
    return root, log


@needs_analyze
def test_verify_passes_on_the_installed_units(staged):
    root, _ = staged
    units = [str(root / UNITDIR / "stallscope.socket"), str(root / UNITDIR / "stallscope.service")]
    out = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True)
    problems = [line for line in (out.stdout + out.stderr).splitlines() if "stallscope" in line]
    assert out.returncode == 0 and not problems, out.stdout + out.stderr


@needs_analyze
def test_verify_catches_a_missing_daemon_command(tmp_path):
    """The check above can fail: without the venv, ExecStart does not exist."""
    if os.path.exists("/opt/stallscope/venv/bin/stallscope"):
        pytest.skip("stallscope is installed on this host")
    root = tmp_path / "root"
    install(root, "--no-venv")
    out = subprocess.run(
        ["systemd-analyze", "verify", str(root / UNITDIR / "stallscope.service")],
        capture_output=True,
        text=True,
    )
    assert "/opt/stallscope/venv/bin/stallscope is not executable" in out.stdout + out.stderr


@needs_analyze
def test_security_exposure_does_not_regress(staged):
    root, _ = staged
    out = subprocess.run(
        [
            "systemd-analyze",
            "security",
            "--offline=true",
            "--no-pager",
            str(root / UNITDIR / "stallscope.service"),
        ],
        capture_output=True,
        text=True,
    )
    m = re.search(r"Overall exposure level for stallscope\.service: ([0-9.]+)", out.stdout)
    assert m, out.stdout + out.stderr
    score = float(m.group(1))
    assert score <= MEASURED_EXPOSURE + EXPOSURE_MARGIN, out.stdout
    # What the probes do not need must stay closed.
    for line in (
        "✓ NoNewPrivileges=",
        "✓ ProtectSystem=",
        "✓ ProtectHome=",
        "✓ PrivateTmp=",
        "✓ User=/DynamicUser=",
        "✓ CapabilityBoundingSet=~CAP_SYS_ADMIN",
        "✓ CapabilityBoundingSet=~CAP_SYS_PTRACE",
        "✓ PrivateNetwork=",
    ):
        assert line in out.stdout, line


def test_capability_allow_list_is_the_measured_one():
    svc = unit("stallscope.service")["Service"]
    assert set(" ".join(svc["CapabilityBoundingSet"]).split()) == CAPABILITIES
    assert set(" ".join(svc["AmbientCapabilities"]).split()) == CAPABILITIES
    for key, value in (
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("StateDirectory", "stallscope"),
        ("RuntimeDirectory", "stallscope"),
        ("Restart", "on-failure"),
        ("User", "stallscope"),
    ):
        assert svc[key] == [value], key
    assert svc["WatchdogSec"] and svc["LimitMEMLOCK"]
    assert svc["ExecStart"][0].startswith(
        "/opt/stallscope/venv/bin/stallscope daemon --config /etc/stallscope/stallscope.toml"
    )


def test_socket_unit_matches_what_the_daemon_adopts():
    sock = unit("stallscope.socket")["Socket"]
    assert sock["ListenSequentialPacket"] == ["/run/stallscope/probe.sock"]
    assert sock["SocketMode"] == ["0660"] and sock["SocketGroup"] == ["stallscope"]
    assert sock["FileDescriptorName"] == [activation.PROBE_FD_NAME]
    # grpcio cannot serve on an inherited descriptor: no API socket here.
    assert len([k for k in sock if k.startswith("Listen")]) == 1


def test_install_says_what_it_did_and_uninstall_reverses_it(staged):
    root, log = staged
    for path in (
        f"/{UNITDIR}/stallscope.service",
        f"/{UNITDIR}/stallscope.socket",
        "/usr/local/lib/sysusers.d/stallscope.conf",
        "/usr/local/lib/tmpfiles.d/stallscope.conf",
        "/etc/stallscope/stallscope.toml",
    ):
        assert f"installed {path}" in log
        assert (root / path.lstrip("/")).is_file()
    # systemd-sysusers and systemd-tmpfiles ran against the root.
    group = (root / "etc/group").read_text()
    passwd = (root / "etc/passwd").read_text()
    gid = re.search(r"^stallscope:x:(\d+):", group, re.M).group(1)
    assert re.search(rf"^stallscope:x:\d+:{gid}:", passwd, re.M)
    st = (root / "var/lib/stallscope").stat()
    assert oct(st.st_mode & 0o777) == "0o750" and str(st.st_gid) == gid
    # An edited config survives a reinstall and an uninstall; the database stays.
    conf = root / "etc/stallscope/stallscope.toml"
    conf.write_text(conf.read_text().replace("gpu_poll_hz = 10.0", "gpu_poll_hz = 5.0"))
    (root / "var/lib/stallscope/stallscope.duckdb").write_bytes(b"data")
    assert "kept your edited /etc/stallscope/stallscope.toml" in install(root, "--venv", str(VENV))
    assert (root / "etc/stallscope/stallscope.toml.new").is_file()
    out = install(root, "--uninstall")
    assert "removed /usr/local/lib/systemd/system/stallscope.service" in out
    for path in (
        UNITDIR + "/stallscope.service",
        UNITDIR + "/stallscope.socket",
        "usr/local/lib/sysusers.d/stallscope.conf",
        "usr/local/lib/tmpfiles.d/stallscope.conf",
        "usr/local/bin/stallscope",
        "etc/stallscope/stallscope.toml.new",
    ):
        assert not (root / path).exists(), path
    assert "gpu_poll_hz = 5.0" in conf.read_text()
    assert (root / "var/lib/stallscope/stallscope.duckdb").exists()
    out = install(root, "--uninstall", "--purge")
    assert not conf.exists() and not (root / "var/lib/stallscope").exists()


def test_shipped_units_reference_files_that_exist():
    svc = unit("stallscope.service")
    assert svc["Unit"]["Requires"] == ["stallscope.socket"]
    assert (REPO / "docs" / "systemd.md").is_file()
    for name in ("stallscope.sysusers.conf", "stallscope.tmpfiles.conf", "stallscope.toml"):
        assert (REPO / "systemd" / name).is_file()
