"""How an off-CPU row's time is split into off-CPU and preempted shares.

An exact `offcpu` row is wholly off CPU and wholly preempted or not; a
summarised row (a pool worker's 50 ms window from the kernel summariser,
`resolution_ns` set) is a window whose off-CPU and preempted parts are
pro-rated from its counters. The live stall alerts and the Prometheus
metrics apply the same rule, so it lives here once. A preempted row that is
a yield (`yielded`: the thread gave its CPU away in sched_yield()) is also
given as a yielded fraction: the alerts count it as run-queue wait, as
step_attribution does; the metrics keep the kernel's split (a yield is an
involuntary switch there, as in nonvoluntary_ctxt_switches).
"""

import numpy as np
import pyarrow.compute as pc


def offcpu_weights(batch):
    """Per row (off-CPU fraction, preempted fraction, sampled, yielded
    fraction: of the preempted one) of an offcpu batch."""
    n = batch.num_rows
    pre = pc.fill_null(batch["preempted"], False).to_numpy(zero_copy_only=False)
    weights = np.zeros((n, 4))
    weights[:, 0] = 1.0
    weights[:, 1] = pre.astype(float)
    if "yielded" in batch.column_names:
        yielded = pc.fill_null(batch["yielded"], False).to_numpy(zero_copy_only=False)
        weights[:, 3] = (pre & yielded).astype(float)
    if "resolution_ns" in batch.column_names and batch["resolution_ns"].null_count < n:
        window = ~batch["resolution_ns"].is_null().to_numpy(zero_copy_only=False)

        def col(name):
            if name not in batch.column_names:
                return np.zeros(n)
            return pc.fill_null(batch[name], 0).to_numpy(zero_copy_only=False).astype(float)

        length = (
            batch["end_ns"].to_numpy(zero_copy_only=False)
            - batch["start_ns"].to_numpy(zero_copy_only=False)
        ).astype(float)
        off = np.clip(col("offcpu_ns") / np.maximum(length, 1.0), 0.0, 1.0)
        events = col("events")
        share = np.where(events > 0, col("preempted_events") / np.maximum(events, 1.0), 0.0)
        weights[window, 0] = off[window]
        weights[window, 1] = (off * share)[window]
        weights[window, 2] = 1.0
    return weights
