"""The daemon with only CAP_BPF + CAP_PERFMON (capsh, as uid nobody): what still works.

The unit grants CAP_BPF, CAP_PERFMON and CAP_DAC_READ_SEARCH; here the
daemon runs with the first two only (Debian's capsh from libcap2-bin: uid
65534, those two as ambient capabilities). It must still start, say why
each probe it cannot run is unavailable (the bcc scheduling probe and the
kernel-cause probes need tracefs, unreadable without CAP_DAC_READ_SEARCH;
scheduling falls back to /proc), and sample with the CPU sampler, which
needs only perf events and BPF: Python frames of every engine (read by the
BPF program: no ptrace), and native leaves named wherever the modules can
be read: another uid's /proc/PID/maps opens with CAP_PERFMON (measured
here; its /proc/PID/root does not, so cpu_elf.py names those leaves from
the files), but an interpreter under /root (mode 0700, pyenv's) cannot be
read by uid nobody without CAP_DAC_READ_SEARCH (the unit has it): its
leaves keep their module and lose their function names.
"""

import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import pythons
from helpers.cpu import Engine, chain_share, stacks
from helpers.daemonproc import DaemonProcess
from helpers.privileged import is_root, require_privileged
from stallscope.probes.cpu_bcc import BccCpuProbe

pytestmark = [pytest.mark.daemon, pytest.mark.privileged]

NOBODY = 65534
PYTHON = "/usr/bin/python3"  # readable by nobody (the venv's interpreter may not be)
SITE = os.path.join(sys.prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                    "site-packages")  # fmt: skip
CAPS = ["--caps=cap_setpcap,cap_setuid,cap_setgid+ep cap_bpf,cap_perfmon+eip", "--keep=1",
        "--user=nobody", "--addamb=cap_bpf,cap_perfmon"]  # fmt: skip


class CapsDaemon(DaemonProcess):
    """The daemon under capsh: uid nobody, CAP_BPF + CAP_PERFMON, nothing else."""

    def command(self):
        boot = (
            f"import site, sys; site.addsitedir({SITE!r}); "
            "from stallscope.cli import main; sys.exit(main(sys.argv[1:]))"
        )
        cmd = [PYTHON, "-c", boot, "daemon", *self.daemon_args()]
        return ["capsh", *CAPS, "--", "-c", "exec " + shlex.join(cmd)]

    def start(self, wait=True, timeout_s=30):
        # The session's template database, copied in by root, belongs to the
        # daemon's uid, as an installed daemon owns its database.
        from helpers.schema_db import copy_template

        if not os.path.exists(self.db):
            copy_template(self.db)
            os.chown(self.db, NOBODY, NOBODY)
        return super().start(wait=wait, timeout_s=timeout_s)


def _engine(sock, python, as_nobody):
    def nobody(cmd):
        return ["capsh", "--user=nobody", "--", "-c", "exec " + shlex.join(cmd)]

    return Engine(python, sock, "chain", 2, prefix=nobody if as_nobody else None).run()


def _caps_of(pid):
    with open(f"/proc/{pid}/status") as f:
        return {k: v.strip() for k, v in (ln.split(":", 1) for ln in f) if k.startswith("Cap")}


def test_only_cap_bpf_and_cap_perfmon(request):
    require_privileged(
        is_root() and shutil.which("capsh") and BccCpuProbe.unavailable() is None,
        "requires root, capsh (Debian's libcap2-bin) and bcc",
    )
    # pytest's tmp dirs are 0700 (root's): uid nobody needs a folder of its own
    folder = Path(tempfile.mkdtemp(prefix="stallscope-caps-", dir="/tmp"))
    os.chmod(folder, 0o755)
    os.chown(folder, NOBODY, NOBODY)
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    daemon = CapsDaemon(folder, sched_backend=None, extra_args=["--cpu-sampler"])
    hidden = pythons.pyenv_python("3.12.") or pythons.pyenv_python("3.13.")
    daemon.start(timeout_s=120)
    try:
        caps = _caps_of(daemon.proc.pid)
        own = _engine(daemon.socket, PYTHON, as_nobody=True)
        other = _engine(daemon.socket, PYTHON, as_nobody=False)
        unreadable = _engine(daemon.socket, hidden, as_nobody=False) if hidden else None
    finally:
        rc, _ = daemon.stop(timeout_s=30)
    assert rc == 0, daemon.new_log()
    assert caps["CapEff"] == f"{(1 << 38) | (1 << 39):016x}", caps  # CAP_PERFMON, CAP_BPF
    status = {
        probe: (backend, state, detail)
        for probe, backend, state, detail in daemon.query(
            "SELECT probe, backend, state, detail FROM probe_status "
            "QUALIFY row_number() OVER (PARTITION BY probe ORDER BY ts_ns) = 1"
        )
    }
    # what does not work, and says why
    assert status["sched"][:2] == ("proc", "active"), status["sched"]
    assert "CAP_DAC_READ_SEARCH" in status["sched"][2]
    for probe in ("page_faults", "irq", "syscalls"):
        assert status[probe][1] == "unavailable" and "CAP_DAC_READ_SEARCH" in status[probe][2]
    # what does: the CPU sampler
    assert status["cpu"][:2] == ("bcc", "active"), status["cpu"]
    for run in (own, other, unreadable):
        if run is None:
            continue
        assert run["ready"]["status"] == "ok"
        good, total, lead_s = chain_share(daemon, run)
        assert total > 300 and good >= 0.95 * total and lead_s <= 3.0, (good, total, lead_s)

    def leaves(run):
        found = stacks(daemon, run["ready"]["pid"], run["spinner"]["tid"])
        total = sum(n for n, _ in found)
        native = [(n, st[0]) for n, st in found if st and st[0][0] == "native"]
        module = sum(n for n, f in native if f[1])
        named = sum(n for n, f in native if f[1] and f[2])
        return total, module, named

    # its own uid (bcc's symbolizer), and root's (bcc cannot follow /proc/PID/root
    # without CAP_SYS_PTRACE: the maps, which CAP_PERFMON opens, and the files
    # themselves, cpu_elf.py). Debian's python3.11 has no .symtab: its static
    # functions stay unnamed (never misnamed), about a third of the leaves here.
    for run in (own, other):
        total, module, named = leaves(run)
        assert module >= 0.95 * total and named >= 0.5 * total, (total, module, named)
    # scheduling still comes, from /proc
    assert daemon.scalar("SELECT count(*) FROM offcpu WHERE pid = ?", [own["ready"]["pid"]]) > 0
    pythons.require(hidden, "a pyenv CPython 3.12 or 3.13 (under /root)")
    found = stacks(daemon, unreadable["ready"]["pid"], unreadable["spinner"]["tid"])
    total = sum(n for n, _ in found)
    hidden_leaves = [
        (n, st[0]) for n, st in found if st and (st[0][1] or "").startswith(pythons.pyenv_root())
    ]
    assert sum(n for n, _ in hidden_leaves) >= 0.5 * total, (total, hidden_leaves[:3])
    assert [f for _, f in hidden_leaves if f[2]] == []  # module known, no name
