"""Benchmark: what the CUDA driver probe costs a launching thread, per call and per step.

An engine process (tests/cuda/cuda_engine.py) drives the fake driver the
tests build (tests/cuda/fake_libcuda.c); the probe (probes/cuda_bcc.py)
follows it, and interleaved rounds measure it with the uprobes detached
(the program loaded, no uprobe in the process: what an untraced process
and a traced one outside a diagnosis window pay) and attached:

  call   the launching thread's CPU time per cuLaunchKernel and per
         cuStreamSynchronize that finds the GPU idle (thread_time_ns over
         N calls through ctypes)
  step   the wall time of a launch-heavy step (1,000 launches and a sync,
         what 10^5 launches/s is at 100 steps/s)

and derives the share of a thread's CPU the probe takes at 10^4 and 10^5
launches/s (the issue's 1 % rule). Medians of the rounds. Needs root, bcc
and cc. `--classic` attaches one uprobe per entry point, as the probe does
on kernels without uprobe_multi links. Usage: python
bench/cuda_probe_cost.py [--rounds N] [--classic]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "daemon"))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from helpers import fakecuda  # noqa: E402
from stallscope.probes.cuda_bcc import BccCudaProbe  # noqa: E402

CALLS = 20_000
STEPS = 20
PER_STEP = 1000


class NullSink:
    def append(self, table, columns):
        pass

    def loss(self, *args):
        pass

    def status(self, *args):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument(
        "--classic",
        action="store_true",
        help="one uprobe per entry point, as on kernels without uprobe_multi links",
    )
    args = ap.parse_args()
    reason = BccCudaProbe.unavailable()
    if reason:
        sys.exit(f"error: {reason}")
    lib = fakecuda.build(tempfile.mkdtemp(prefix="cuda-bench-"))
    engine = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "..", "tests", "cuda", "cuda_engine.py"), "serve",
         str(lib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    ids = json.loads(engine.stdout.readline())

    def call(line):
        engine.stdin.write(line + "\n")
        engine.stdin.flush()
        return json.loads(engine.stdout.readline())

    probe = BccCudaProbe()
    if args.classic:
        probe._multi = False
    probe.start(NullSink())
    probe.track(ids["pid"])
    call("load")
    probe._scan(ids["pid"])
    got = {m: {"launch": [], "sync": [], "step": []} for m in ("detached", "attached")}
    detach_s = []  # from detach() until the kernel holds none of the uprobes
    try:
        call(f"cost {CALLS} cuLaunchKernel")  # warm up
        for _ in range(args.rounds):
            for mode in ("detached", "attached"):
                if mode == "attached":
                    probe.attach()
                else:
                    t0 = time.monotonic()
                    probe.detach()
                    # detach() leaves the uprobes' perf events to a closing
                    # thread (~0.1 s each): measured before they are closed,
                    # the detached arm paid the traps (and the next attach,
                    # two sets of them: ~20 us a call in both arms)
                    probe._closing([], wait=True)
                    if probe.held_uprobes() == {} and got["attached"]["launch"]:
                        detach_s.append(time.monotonic() - t0)
                _, cpu = call(f"cost {CALLS} cuLaunchKernel")
                got[mode]["launch"].append(cpu / CALLS)
                _, cpu = call(f"cost {CALLS} cuStreamSynchronize")
                got[mode]["sync"].append(cpu / CALLS)
                got[mode]["step"].append(statistics.median(call(f"steps {STEPS} {PER_STEP}")))
        probe.detach()
    finally:
        engine.stdin.write("quit\n")
        engine.stdin.close()
        engine.wait()
        probe.stop()
    med = {m: {k: statistics.median(v) for k, v in d.items()} for m, d in got.items()}
    per_launch = med["attached"]["launch"] - med["detached"]["launch"]
    out = {
        "rounds": args.rounds,
        "uprobes": "one per entry point" if args.classic else "uprobe_multi links",
        "launch_cpu_ns": {m: round(med[m]["launch"]) for m in med},
        "sync_cpu_ns": {m: round(med[m]["sync"]) for m in med},
        "step_1000_launches_us": {m: round(med[m]["step"] / 1000, 1) for m in med},
        "detach_to_released_s": round(statistics.median(detach_s), 3) if detach_s else None,
        "probe_ns_per_launch": round(per_launch),
        "probe_ns_per_sync": round(med["attached"]["sync"] - med["detached"]["sync"]),
        "probe_us_per_step": round((med["attached"]["step"] - med["detached"]["step"]) / 1000, 1),
        "cpu_share_at_1e4_launches_s_pct": round(per_launch * 1e4 / 1e9 * 100, 2),
        "cpu_share_at_1e5_launches_s_pct": round(per_launch * 1e5 / 1e9 * 100, 2),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
