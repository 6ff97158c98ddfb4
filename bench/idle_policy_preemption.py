"""What the kernel does with a low-priority thread that wakes beside a busy engine.

The daemon's background threads run under SCHED_IDLE so that the engine
always wins, yet on two full CPUs they still preempt an engine's step
thread (bench/daemon_preemption.py). This measures the kernel, not
stallscope: an engine process (its step thread unpinned, RATE steps/s of
STEP_MS of pure-Python work, a sibling thread hashing on the other CPU, as
in tests/helpers/observer_engine.py) runs beside a "sleeper" process of
three threads that wake 10, 5 and 2 times a second for ~1.5, ~0.8 and
~2.5 ms of work (about the daemon's wake-ups and bursts), under each
policy in turn:

  none          no sleeper (the baseline)
  idle          SCHED_IDLE (the daemon's background threads)
  batch19       SCHED_BATCH at nice 19
  batch19-long  SCHED_BATCH at nice 19 with a 100 ms slice (sched_setattr's
                sched_runtime, the EEVDF slice request; SCHED_IDLE ignores it)
  idle-nosib    SCHED_IDLE, the engine without its sibling (a CPU left free)
  idle-engine-slice  SCHED_IDLE, the engine's step thread asking for a 10 ms
                slice (longer than its step)

A bcc program on sched_switch counts the step thread's involuntary
switch-outs ((prev_state & 0xff) == 0) to a sleeper thread, how long the
sleeper kept the CPU, and the sleepers' wake-ups. Printed per arm (medians
of the rounds): preemptions per 10,000 steps, per 100 sleeper wake-ups, and
their mean length. Root (bcc); asserts nothing.

    .venv/bin/python bench/idle_policy_preemption.py [--rounds 2] [--seconds 20]
"""

import argparse
import ctypes
import hashlib
import json
import os
import statistics
import struct
import subprocess
import sys
import threading
import time

ARMS = ("none", "idle", "batch19", "batch19-long", "idle-nosib", "idle-engine-slice")
SLEEPERS = ((0.1, 1.5), (0.2, 0.8), (0.5, 2.5))  # (period s, burst ms)
SCHED_BATCH, SCHED_IDLE = 3, 5
NR_SCHED_SETATTR = 314  # x86_64

PROGRAM = r"""
BPF_ARRAY(counts, u64, 4);  // preemptions by a sleeper, their ns, sleeper wake-ups, switch-outs
BPF_ARRAY(out_at, u64, 1);

static inline int is_sleeper(const char *c) {
    return c[0] == 's' && c[1] == 'l' && c[2] == 'e' && c[3] == 'e' && c[4] == 'p';
}

TRACEPOINT_PROBE(sched, sched_wakeup) {
    char c[16];
    __builtin_memcpy(c, args->comm, 16);
    if (is_sleeper(c)) {
        int k = 2;
        u64 *v = counts.lookup(&k);
        if (v) __sync_fetch_and_add(v, 1);
    }
    return 0;
}

TRACEPOINT_PROBE(sched, sched_switch) {
    int z = 0;
    if (args->next_pid == STEP_TID) {
        u64 *t = out_at.lookup(&z);
        if (t && *t) {
            int k = 1;
            u64 *v = counts.lookup(&k);
            if (v) __sync_fetch_and_add(v, bpf_ktime_get_ns() - *t);
            *t = 0;
        }
    }
    if (args->prev_pid == STEP_TID && (args->prev_state & 0xff) == 0) {
        int k = 3;
        u64 *v = counts.lookup(&k);
        if (v) __sync_fetch_and_add(v, 1);
        char c[16];
        __builtin_memcpy(c, args->next_comm, 16);
        if (is_sleeper(c)) {
            k = 0;
            v = counts.lookup(&k);
            if (v) __sync_fetch_and_add(v, 1);
            u64 now = bpf_ktime_get_ns();
            out_at.update(&z, &now);
        }
    }
    return 0;
}
"""


def name_thread(name):
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
        f.write(name)


def work(n):
    s = 0
    for i in range(n):
        s += i
    return s


def per_ms():
    t = time.perf_counter()
    work(200_000)
    return 200_000 / ((time.perf_counter() - t) * 1000)


def engine(seconds, rate, step_ms, sibling, slice_ns):
    """The engine process: prints its step thread's tid, then its step count."""
    stop = threading.Event()

    def hash_loop():
        name_thread("sibling")
        buf = b"x" * (1 << 20)
        while not stop.is_set():
            hashlib.sha256(buf).digest()  # releases the GIL

    if sibling:
        threading.Thread(target=hash_loop, daemon=True).start()
    n = int(step_ms * per_ms())
    if slice_ns:
        set_policy(0, 0, slice_ns)  # SCHED_OTHER, nice 0: only the slice asked for
    print(threading.get_native_id(), flush=True)
    sys.stdin.readline()  # the counter is attached
    period, steps = 1.0 / rate, 0
    t_next = time.monotonic()
    end = t_next + seconds
    while time.monotonic() < end:
        work(n)
        steps += 1
        t_next += period
        delay = t_next - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    stop.set()
    print(steps, flush=True)


def set_policy(policy, nice, slice_ns):
    """sched_setattr(2) on the calling thread (os.sched_setscheduler cannot
    set a nice or a slice)."""
    attr = struct.pack("IIQiIQQQ", 48, policy, 0, nice, 0, slice_ns, 0, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(NR_SCHED_SETATTR, 0, ctypes.create_string_buffer(attr, 48), 0) != 0:
        raise OSError(ctypes.get_errno(), "sched_setattr")


def sleeper(arm, seconds):
    """The sleeper process: its threads wake and work, under `arm`'s policy."""
    k = per_ms()

    def loop(period, burst_ms):
        name_thread("sleeper")
        if arm.startswith("idle"):
            set_policy(SCHED_IDLE, 0, 0)
        else:
            set_policy(SCHED_BATCH, 19, 100_000_000 if arm == "batch19-long" else 0)
        n = int(burst_ms * k)
        while True:
            work(n)
            time.sleep(period)

    for period, burst in SLEEPERS:
        threading.Thread(target=loop, args=(period, burst), daemon=True).start()
    time.sleep(seconds)


def run_arm(arm, seconds, rate, step_ms):
    from bcc import BPF

    me = [sys.executable, os.path.abspath(__file__)]
    sleepers = None
    if arm != "none":
        sleepers = subprocess.Popen([*me, "--sleeper", arm, "--seconds", str(seconds + 10)])
    eng = subprocess.Popen(
        [*me, "--engine", "nosib" if arm.endswith("nosib") else "sib", "--seconds", str(seconds),
         "--rate", str(rate), "--step-ms", str(step_ms),
         "--engine-slice-ms", "10" if arm == "idle-engine-slice" else "0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        tid = int(eng.stdout.readline())
        b = BPF(text=PROGRAM.replace("STEP_TID", str(tid)))
        eng.stdin.write("go\n")
        eng.stdin.flush()
        steps = int(eng.stdout.readline())
        c = [b["counts"][ctypes.c_int(i)].value for i in range(4)]
        b.cleanup()
    finally:
        eng.wait(timeout=60)
        if sleepers is not None:
            sleepers.kill()
            sleepers.wait()
    return {
        "steps": steps,
        "preempted_by_sleeper": c[0],
        "per_10k_steps": round(c[0] * 10_000 / max(1, steps), 1),
        "per_100_wakeups": round(100 * c[0] / c[2], 2) if c[2] else None,
        "mean_ms": round(c[1] / c[0] / 1e6, 2) if c[0] else None,
        "sleeper_wakeups": c[2],
        "involuntary_per_10k": round(c[3] * 10_000 / max(1, steps), 1),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--step-ms", type=float, default=2.5)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--engine", choices=("sib", "nosib"), help=argparse.SUPPRESS)
    ap.add_argument("--engine-slice-ms", type=float, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--sleeper", choices=ARMS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine:
        slice_ns = int(args.engine_slice_ms * 1e6)
        return engine(args.seconds, args.rate, args.step_ms, args.engine == "sib", slice_ns)
    if args.sleeper:
        return sleeper(args.sleeper, args.seconds)
    arms = args.arms.split(",")
    if unknown := [a for a in arms if a not in ARMS]:
        ap.error(f"unknown arm(s) {unknown}: choose from {', '.join(ARMS)}")
    if os.geteuid() != 0:
        sys.exit("idle_policy_preemption: needs root (a bcc program on sched_switch)")
    if len(os.sched_getaffinity(0)) != 2:
        print("note: written for a 2-CPU machine (engine + sibling fill it)", file=sys.stderr)
    results = {a: [] for a in arms}
    for r in range(args.rounds):
        for arm in arms:
            print(f"round {r + 1}/{args.rounds}: {arm}", file=sys.stderr, flush=True)
            results[arm].append(run_arm(arm, args.seconds, args.rate, args.step_ms))
            print(json.dumps(results[arm][-1]), file=sys.stderr, flush=True)
    print(
        f"{'arm':14s} {'per 10k steps':>14s} {'per 100 wakes':>14s} {'mean ms':>8s} {'invol/10k':>10s}"
    )
    summary = {}
    for arm, rows in results.items():
        med = {}
        for key in ("per_10k_steps", "per_100_wakeups", "mean_ms", "involuntary_per_10k"):
            vals = [row[key] for row in rows if row[key] is not None]
            med[key] = statistics.median(vals) if vals else None
        summary[arm] = med
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        print(f"{arm:14s} {fmt(med['per_10k_steps']):>14s} {fmt(med['per_100_wakeups']):>14s} "
              f"{fmt(med['mean_ms']):>8s} {fmt(med['involuntary_per_10k']):>10s}")  # fmt: skip
    print(json.dumps({"medians": summary, "rounds": results, "seconds": args.seconds}))


if __name__ == "__main__":
    main()
