"""The explicit registry of probe backends, best first, and the selection rule."""

import importlib
import logging

from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

# probe name -> backends, best first, as "module:Class" so that a backend
# whose module cannot even be imported (no bcc, no pynvml) is simply skipped
# with that reason.
PROBES = {
    "sched": [
        "stallscope.probes.sched_bcc:BccSchedProbe",
        "stallscope.probes.sched_perf:PerfSchedProbe",
        "stallscope.probes.sched_proc:ProcSchedProbe",
    ],
    "gpu": ["stallscope.probes.gpu_nvml:NvmlGpuProbe"],
    # kernel causes inside a step (docs/kernel-causes.md)
    "page_faults": ["stallscope.probes.faults_bcc:BccFaultsProbe"],
    "irq": ["stallscope.probes.irq_bcc:BccIrqProbe"],
    "steal": ["stallscope.probes.steal_proc:ProcStealProbe"],
    "syscalls": ["stallscope.probes.syscalls_bcc:BccSyscallsProbe"],
    # where traced processes ran, what shared their CPUs (docs/placement.md)
    "placement": ["stallscope.probes.placement_proc:ProcPlacementProbe"],
    # what tracked threads run on CPU, Python frames included (docs/cpu-sampler.md)
    "cpu": ["stallscope.probes.cpu_bcc:BccCpuProbe"],
    # host time inside the CUDA driver (docs/cuda-probe.md)
    "cuda": ["stallscope.probes.cuda_bcc:BccCudaProbe"],
}


def load(spec):
    module, _, cls = spec.partition(":")
    return getattr(importlib.import_module(module), cls)


def select_backend(name, settings=None, prefer=None):
    """Return (probe class or None, [(backend spec, reason), ...] skipped).

    `prefer` names a backend ('bcc', 'perf', 'proc', 'nvml', 'none') to use
    instead of the best available one."""
    skipped = []
    for spec in PROBES.get(name, []):
        try:
            cls = load(spec)
        except Exception as exc:  # the module itself needs what is missing
            skipped.append((spec, f"cannot load {spec}: {exc}"))
            continue
        if prefer and prefer != cls.backend:
            skipped.append((spec, f"not selected (--{name}-backend={prefer})"))
            continue
        reason = cls.unavailable(settings)
        if reason is None:
            return cls, skipped
        skipped.append((spec, reason))
    return None, skipped
