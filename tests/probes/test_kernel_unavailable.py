"""A kernel-cause probe that cannot run here says why and how to fix it, never crashes."""

import pytest

from stallscope.probes import bpf_common
from stallscope.probes.base import ProbeSettings
from stallscope.probes.faults_bcc import BccFaultsProbe
from stallscope.probes.irq_bcc import BccIrqProbe
from stallscope.probes.registry import PROBES, select_backend
from stallscope.probes.syscalls_bcc import BccSyscallsProbe


def fake_tracefs(tmp_path, events):
    (tmp_path / "events").mkdir()
    for ev in events:
        d = tmp_path / "events" / ev.replace(":", "/")
        d.mkdir(parents=True)
        (d / "format").write_text("name: x\n")
    return str(tmp_path)


@pytest.mark.parametrize("cls", [BccFaultsProbe, BccIrqProbe, BccSyscallsProbe])
def test_missing_tracepoint_is_a_reason(cls, tmp_path):
    pytest.importorskip("bcc")
    present = list(cls.tracepoints[1:])  # the first one is missing
    tracefs = fake_tracefs(tmp_path, present)
    reason = bpf_common.bcc_unavailable(cls.tracepoints, tracefs=tracefs, privileged=True)
    assert reason == f"kernel lacks the {cls.tracepoints[0]} tracepoint (not in {tracefs}/events)"


def test_without_privileges_or_tracefs(tmp_path):
    reason = bpf_common.bcc_unavailable(["irq:softirq_entry"], privileged=False)
    assert "CAP_BPF+CAP_PERFMON" in reason
    pytest.importorskip("bcc")
    reason = bpf_common.bcc_unavailable(
        ["irq:softirq_entry"], tracefs=str(tmp_path / "none"), privileged=True
    )
    assert "mount -t tracefs" in reason


def test_registry_names_every_kernel_cause_probe(monkeypatch):
    assert {"page_faults", "irq", "steal", "syscalls"} <= set(PROBES)
    monkeypatch.setattr(bpf_common, "has_bpf_privileges", lambda: False)
    for name in ("page_faults", "irq", "syscalls"):
        cls, skipped = select_backend(name, ProbeSettings())
        assert cls is None and "CAP_BPF" in skipped[0][1]
