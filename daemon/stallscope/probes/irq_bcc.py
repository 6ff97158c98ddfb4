"""IRQ-time probe (bcc): hard and soft IRQ runs that interrupted tracked threads.

Loads `irq_bcc.c` on irq:irq_handler_entry/exit and irq:softirq_entry/exit;
each handler or softirq run that started while a tracked thread was current
becomes one `irq_time` row (cpu, [start_ns, end_ns], 'hardirq' or 'softirq',
IRQ number or softirq vector). Softirqs run at a hard IRQ's exit or when
the thread itself re-enables bottom halves (e.g. after sending on loopback)
both count: either way the time is not the thread's. It must never run
Python per event.
"""

import numpy as np
import pyarrow as pa

from stallscope.probes import bpf_common
from stallscope.probes.bpf_probe import BccTracepointProbe

_KINDS = bpf_common.header_defines("irq_bcc.h", "IRQ_KIND_")
KIND_NAMES = {_KINDS["IRQ_KIND_HARD"]: "hardirq", _KINDS["IRQ_KIND_SOFT"]: "softirq"}
# softirq vectors (include/linux/interrupt.h), for docs and reports
SOFTIRQ_NAMES = ("HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET",
                 "SCHED", "HRTIMER", "RCU")  # fmt: skip


class BccIrqProbe(BccTracepointProbe):
    """IRQ handler and softirq time taken from tracked threads."""

    name = "irq"
    source = "irq_bcc.c"
    tracepoints = (
        "irq:irq_handler_entry",
        "irq:irq_handler_exit",
        "irq:softirq_entry",
        "irq:softirq_exit",
    )
    record_fields = ("start_ns", "end_ns", "pid", "tid", "vec", "cpu", "kind")
    loss_reasons = {
        "reserve_failed": "IRQ ring buffer full: IRQ intervals dropped (raise kernel_ring_pages)",
    }

    def _emit(self, recs):
        kinds = np.where(recs["kind"] == _KINDS["IRQ_KIND_HARD"], "hardirq", "softirq")
        self._append(
            "irq_time",
            {
                "pid": recs["pid"].astype(np.int32),
                "tid": recs["tid"].astype(np.int32),
                "cpu": recs["cpu"].astype(np.int16),
                "start_ns": recs["start_ns"].astype(np.int64),
                "end_ns": recs["end_ns"].astype(np.int64),
                "kind": pa.array(kinds.tolist(), type=pa.string()),
                "vec": recs["vec"].astype(np.int32),
            },
        )
