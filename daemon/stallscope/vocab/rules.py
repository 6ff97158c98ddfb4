"""The step rules in one place: what slow, idle and a cause mean.

The SQL views read their parameters from `step_params` (queries/step/
00_params.sql, changed per connection with SET VARIABLE); this module holds
the same defaults under the same names, upper-cased, for the Python readers
(the live stall alerts, `top`, the report and compare), and the one cause
vocabulary in precedence order. tests/queries/test_rules.py checks that the
two agree. It computes nothing from a database and imports nothing heavy.
"""

# step_params defaults (name here = column of step_params, upper-cased)
SLOW_FACTOR = 1.2  # slow: duration > SLOW_FACTOR x baseline
CAUSE_MIN_SHARE = 0.5  # a component names the cause at >= this share of the excess
MIGRATION_COST_NS = 50_000  # charged per migration
GPU_CLOCK_FACTOR = 0.9  # SM clock below this x the run's reference is a drop
GPU_SAMPLE_HOLD_NS = 1_000_000_000  # an NVML sample stands for at most this long
LONG_STEP_NS = 100_000_000  # a long step (seed tables)
PREFILL_STAGE = "prefill"  # prompt processing: not a stall in the seed tables
BASELINE_MIN_STEPS = 5  # smallest baseline group; smaller ones fall back
WORK_BUCKETS_PER_OCTAVE = 4.0  # work buckets per doubling of spans.work
LOCK_CHAIN_GAP_NS = 50_000  # a timed-out wait joins the lock wait that follows within this
CUDA_SYNC_TAIL_NS = 500_000  # a sync ending this soon after a preemption: that one stays preemption

# Every cause step_attribution names, in precedence order (ties go to the
# earlier): waits (off-CPU parts, and gpu_wait: the host waiting on the GPU,
# asleep or spinning), then on-CPU parts, then the two verdicts of a slow
# step that no component explains.
OFF_CPU_CAUSES = ("gc", "gpu_wait", "lock", "peer", "runqueue", "throttled", "preemption",
                  "blocked")  # fmt: skip
ON_CPU_CAUSES = ("irq", "steal", "page_fault", "syscall", "migration", "launch", "submit",
                 "gpu_clock")  # fmt: skip
CAUSES = OFF_CPU_CAUSES + ON_CPU_CAUSES + ("uncovered", "unexplained")

# The step_attribution column that sizes each cause's component (ns).
CAUSE_COLUMNS = {
    "gc": "gc_ns",
    "gpu_wait": "gpu_wait_ns",
    "lock": "lock_ns",
    "peer": "peer_ns",
    "runqueue": "runq_ns",
    "throttled": "throttled_ns",
    "preemption": "preempted_ns",
    "blocked": "blocked_ns",
    "irq": "irq_ns",
    "steal": "steal_ns",
    "page_fault": "page_fault_ns",
    "syscall": "syscall_ns",
    "migration": "migration_ns",
    "launch": "launch_ns",
    "submit": "submit_host_ns",
    "gpu_clock": "gpu_clock_ns",
}


def is_slow(duration_ns, baseline_ns, idle=False, slow_factor=SLOW_FACTOR):
    """The slow rule: never for idle steps or without a baseline."""
    return not idle and bool(baseline_ns) and duration_ns > slow_factor * baseline_ns


def is_idle(batch, marked=False, reports_batch=True):
    """Idle: marked so by the client, or batch 0 where the engine reports batch
    sizes at all (where it never does, batch 0 means unknown)."""
    return bool(marked) or (reports_batch and not batch)


def name_cause(excess_ns, parts, uncovered=False, min_share=CAUSE_MIN_SHARE):
    """The cause of a slow step from its disjoint components ({cause: ns}):
    the largest, if > 0 and at least min_share of the excess (ties: CAUSES
    order); else 'uncovered' when a probe missed the step, else 'unexplained'."""
    best, best_ns = None, 0
    for cause in CAUSES:
        ns = parts.get(cause) or 0
        if ns > best_ns:
            best, best_ns = cause, ns
    if best is not None and excess_ns > 0 and best_ns >= min_share * excess_ns:
        return best
    return "uncovered" if uncovered else "unexplained"
