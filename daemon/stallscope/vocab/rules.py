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
PEER_END_GAP_NS = 1_000_000  # a step waited for a peer span that ended at most this long before it
PEER_END_GAP_SHARE = (
    0.1  # ... plus this share of the peer's time inside the step (poll back-off, preemption)
)
PEER_MAX_DEPTH = 4  # hops followed from a step to the peer whose own cause is named

CODE_Z = 4.265  # a profile frame's excess is significant at this many SDs (level 1e-5)
CPU_SLOW_POWER = 0.9  # cpu_slow: the chance the samples had of finding a localized excess
CPU_SLOW_REF_SHARE = 0.1  # ... of half the excess, in a frame with this baseline share

# Fixed rules of the on-CPU causes (queries/step/11_profile.sql and
# 09_attribution.sql hold the same numbers; tests/queries/test_rules.py checks).
OTHER_TASK_WINDOW_NS = 10_000_000  # a switch-in this long before a step counts for it
BAND_Z = 2.326  # slow band: one-sided sign test at level 0.01
BAND_MIN_STEPS = 10  # ... over at least this many other steps
BAND_HALF_WIDTH_S = 1  # ... within this many whole seconds either side of the step's
DEFAULT_SAMPLE_HZ = 1000  # CPU samples of coverage rows without a rate

# Every cause step_attribution names, in precedence order (ties go to the
# earlier; shared/ARCHITECTURE.md's one order for the wave): waits (time the
# step waited on something else, asleep or spinning: gpu_wait is the host
# waiting on the GPU), then its own CPU time, then the two verdicts of a slow
# step that no component explains. `peer` covers a wait for another process
# of the run group whether the step slept or spun (peer_wait), so it comes
# before the off-CPU parts.
OFF_CPU_CAUSES = (
    "gc",
    "gpu_wait",
    "peer",
    "lock",
    "runqueue",
    "throttled",
    "preemption",
    "blocked",
)
ON_CPU_CAUSES = (
    "irq",
    "steal",
    "page_fault",
    "syscall",
    "migration",
    "launch",
    "code",
    "submit",
    "gpu_clock",
    "cpu_slow",
)
CAUSES = OFF_CPU_CAUSES + ON_CPU_CAUSES + ("uncovered", "unexplained")
# Evidence that the CPU gave less (step_attribution.cpu_slow_evidence).
CPU_SLOW_EVIDENCE = ("other_task", "steal", "band")

# How a step waited for its peer (step_attribution.peer_wait): off CPU, or
# on CPU polling (vLLM's engine core spins on a shared-memory queue).
PEER_WAITS = ("slept", "spun")

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
    "code": "code_ns",
    "submit": "submit_host_ns",
    "gpu_clock": "gpu_clock_ns",
    "cpu_slow": "cpu_slow_ns",
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
