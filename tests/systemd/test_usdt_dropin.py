"""The opt-in drop-in for GC from outside adds exactly CAP_SYS_PTRACE.

bcc raises CPython's USDT semaphores by writing /proc/PID/mem (seen with
strace), which needs ptrace access to the traced process; the service's
unit does not grant it. The drop-in named in the gc probe's message exists,
is a [Service] drop-in, and adds that one capability and nothing else."""

from pathlib import Path

from stallscope.probes import gc_usdt

REPO = Path(__file__).resolve().parents[2]


def _entries(path):
    section, out = None, []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.append((section, key, value))
    return out


def test_the_drop_in_adds_exactly_cap_sys_ptrace():
    drop_in = REPO / gc_usdt.DROP_IN
    assert drop_in.is_file()
    assert sorted(_entries(drop_in)) == [
        ("Service", "AmbientCapabilities", "CAP_SYS_PTRACE"),
        ("Service", "CapabilityBoundingSet", "CAP_SYS_PTRACE"),
    ]
    unit = (REPO / "systemd" / "stallscope.service").read_text()
    assert "CAP_SYS_PTRACE" not in unit  # opt-in: the shipped unit stays as it is
