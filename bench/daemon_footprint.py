"""Benchmark: the daemon's own CPU and memory, old tree against new, side by side.

Each tree is a checkout with its own `.venv` (`make bootstrap`); its daemon
runs as `<tree>/.venv/bin/python -m stallscope.cli daemon` with the probes it
finds (bcc sched and the kernel-cause probes as root; no GPU here). Modes:

  idle    no client: the daemon's CPU while nothing happens
  steps   one engine process at 200 steps/s x 4 spans (sleeps between steps,
          so every step is also a few sched switches)
  demo    the demo's scenario engine (`stallscope.demo.scenario`, ~475 spans/s)
  transformers  HF transformers' continuous batching, torch CPU with 2 intra-op
          threads, 8 requests/s, under `stallscope run --preset transformers`
          (the engines extra; the engine's start-up is inside the warm-up)
  flood   4 sender processes replay 127-record datagrams as fast as the daemon
          takes them (sched and gpu probes off, as bench/ingest_throughput.py):
          peak RSS (VmHWM) and records stored

CPU is utime+stime of the daemon from /proc over the measured window, after
a warm-up, as % of one core. Trees run interleaved, round by round (A B, B A,
...), and the median of the rounds is reported with the new/old ratio. With
`--profile DIR` each (tree, mode) is also sampled with py-spy (non-blocking,
100 Hz, per thread) in a separate run and the collapsed stacks are summarised
by thread and by function (self samples).

Usage (as root):
  python bench/daemon_footprint.py --tree old=/tmp/foot-base --tree new=. \
      --modes idle,steps,demo,flood --rounds 3 --seconds 20
"""

import argparse
import collections
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from trees import tree_env

HZ = os.sysconf("SC_CLK_TCK")
# Run by path, so that an older checkout's Python can run it too.
FLOOD_SCRIPT = str(Path(__file__).resolve().parent.parent / "daemon/stallscope/testing/flood.py")

STEPS_CLIENT = textwrap.dedent(
    """
    import sys, time
    import probe_client
    sock, seconds, rate = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    probe = probe_client.connect(socket_path=sock, run_label="footprint")
    period = 1.0 / rate
    t_next = time.monotonic()
    end = t_next + seconds
    def work(n=300):
        s = 0
        for i in range(n):
            s += i
        return s
    while time.monotonic() < end:
        t0 = probe.begin()
        for stage in ("prelude", "recurrent", "coda"):
            t1 = probe.begin()
            work()
            probe.end("submit", t1, stage=stage, batch=4)
        probe.end("step", t0, stage="recurrent", batch=4)
        t_next += period
        delay = t_next - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    probe.close()
    """
)


def proc_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def thread_cpu_s(pid):
    """{comm: CPU seconds} summed over the threads of `pid` by kernel name
    (the new daemon names its threads 'stallscope/...'), from each thread's
    schedstat (on-CPU ns, exact; stat's utime+stime count 10 ms ticks, too
    coarse for threads that run ~0.1% of a core in a 15 s window)."""
    out = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[comm] += int(f.read().split()[0]) / 1e9
        except OSError:
            continue
    return out


def proc_status_kb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class Daemon:
    def __init__(self, tree, args):
        self.tree = Path(tree).resolve()
        self.tmp = Path(tempfile.mkdtemp(prefix="stallscope-foot-"))
        self.sock = str(self.tmp / "probe.sock")
        self.db = str(self.tmp / "db.duckdb")
        self.log = self.tmp / "daemon.log"
        py = self.tree / ".venv" / "bin" / "python"
        cmd = [str(py), "-m", "stallscope.cli", "daemon", "--socket", self.sock, "--db", self.db]
        cmd += ["--gpu-backend", "none", *args]
        self.logf = open(self.log, "w")
        # The tree's own code and views (bench/trees.py: a tree that shares
        # another's .venv, whose editable install points at that other
        # checkout, still runs its own).
        env = tree_env(self.tree)
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=self.logf, cwd=self.tmp, env=env)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited early:\n{self.log.read_text()}")
            if os.path.exists(self.sock) and "listening on" in self.log.read_text():
                return
            time.sleep(0.05)
        raise RuntimeError("daemon not ready in 120 s")

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.logf.close()

    def count(self, sql):
        import duckdb

        con = duckdb.connect(self.db, read_only=True)
        try:
            return con.execute(sql).fetchone()[0]
        finally:
            con.close()

    def cleanup(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


def pyspy():
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.path.exists(here) else "py-spy"


def client_python():
    return sys.executable


def start_load(mode, d, seconds):
    """The load processes of `mode` for `seconds` (none for idle)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    py = client_python()
    if mode == "idle":
        return []
    if mode == "steps":
        return [subprocess.Popen([py, "-c", STEPS_CLIENT, d.sock, str(seconds), "200"], env=env)]
    if mode == "demo":
        cmd = [py, "-m", "stallscope.demo.scenario", d.sock, "--duration", str(seconds)]
        cmd += ["--rate", "1", "--label", "demo", "--submit-jitter", "0.017:3"]
        return [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)]
    if mode == "transformers":
        # HF transformers' continuous batching (torch CPU, 2 intra-op
        # threads: an OpenMP pool) under `stallscope run --preset transformers`
        engine = str(
            Path(__file__).resolve().parent.parent / "daemon/stallscope/demo/transformers_engine.py"
        )
        cmd = [py, "-m", "stallscope.cli", "run", "--socket", d.sock, "--preset", "transformers",
               "--", py, engine, "--serve-seconds", str(seconds), "--rate", "8",
               "--torch-threads", "2"]  # fmt: skip
        env.pop("OMP_NUM_THREADS", None)
        return [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)]
    if mode == "flood":
        return [
            subprocess.Popen(
                [py, FLOOD_SCRIPT, d.sock, str(seconds), str(i + 1)],
                env=env,
                stdout=subprocess.PIPE,
            )
            for i in range(4)
        ]
    raise ValueError(mode)


def measure(tree, mode, seconds, warmup_s, profile_to=None, profile_hz=100):
    args = ["--sched-backend", "none"] if mode == "flood" else []
    d = Daemon(tree, args)
    try:
        hwm_start_mb = proc_status_kb(d.pid, "VmHWM") / 1024
        loads = start_load(mode, d, seconds + warmup_s)
        time.sleep(warmup_s)
        cpu0, t0, th0 = proc_cpu_s(d.pid), time.monotonic(), thread_cpu_s(d.pid)
        spy = None
        if profile_to is not None:
            spy = subprocess.Popen(
                [pyspy(), "record", "--pid", str(d.pid), "--rate", str(profile_hz), "--nonblocking"]
                + ["--threads", "--format", "raw", "--output", str(profile_to)]
                + ["--duration", str(int(seconds))],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        rss_max_mb, end = 0.0, time.monotonic() + seconds
        while time.monotonic() < end:
            rss_max_mb = max(rss_max_mb, proc_status_kb(d.pid, "VmRSS") / 1024)
            time.sleep(0.25)
        cpu1, t1, th1 = proc_cpu_s(d.pid), time.monotonic(), thread_cpu_s(d.pid)
        sent = 0
        for p in loads:
            out, _ = p.communicate(timeout=seconds + 120)
            if out:
                sent += int(out.split()[-1])
        if spy is not None:
            spy.wait(timeout=60)
        time.sleep(0.5)
        hwm_mb = proc_status_kb(d.pid, "VmHWM") / 1024
        d.stop()
        out = {"cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0), "peak_rss_mb": hwm_mb}
        out["start_peak_rss_mb"] = hwm_start_mb  # start-up (bcc compiles) before any load
        out["window_max_rss_mb"] = rss_max_mb  # VmRSS sampled every 0.25 s
        out["threads"] = {
            k: round(100 * (th1[k] - th0.get(k, 0)) / (t1 - t0), 3)
            for k in sorted(th1)
            if th1[k] > th0.get(k, 0)
        }
        # the threads' exact on-CPU time (threads that ended in the window are missing)
        out["threads_cpu_pct"] = round(sum(out["threads"].values()), 3)
        if mode == "flood":
            out["sent"] = sent
            out["stored"] = d.count("SELECT count(*) FROM spans")
        else:
            out["offcpu_rows"] = d.count("SELECT count(*) FROM offcpu")
            out["spans"] = d.count("SELECT count(*) FROM spans")
        return out
    finally:
        if d.proc.poll() is None:
            d.stop()
        d.cleanup()


def summarise_profile(path, top=25):
    """Self samples by thread and by leaf function from py-spy's raw output."""
    by_thread, by_leaf, by_frame = (
        collections.Counter(),
        collections.Counter(),
        collections.Counter(),
    )
    total = 0
    for line in Path(path).read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        n = int(n)
        frames = stack.split(";")
        total += n
        by_thread[frames[0]] += n
        by_leaf[frames[-1]] += n
        for f in set(frames[1:]):
            by_frame[f] += n
    lines = [f"  {total} samples"]
    lines.append("  by thread:")
    lines += [f"    {n:6d} {100 * n / total:5.1f}%  {t}" for t, n in by_thread.most_common(10)]
    lines.append("  self (leaf frame):")
    lines += [f"    {n:6d} {100 * n / total:5.1f}%  {t}" for t, n in by_leaf.most_common(top)]
    lines.append("  inclusive (frame anywhere on the stack):")
    lines += [f"    {n:6d} {100 * n / total:5.1f}%  {t}" for t, n in by_frame.most_common(top)]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH (a checkout)")
    ap.add_argument("--modes", default="idle,steps,demo,flood")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--profile", default=None, help="folder for py-spy profiles (one run each)")
    ap.add_argument("--profile-hz", type=int, default=100, help="py-spy's sampling rate")
    ap.add_argument("--json", default=None, help="write every measurement here")
    a = ap.parse_args()
    trees = [t.split("=", 1) for t in a.tree]
    modes = a.modes.split(",")
    results = collections.defaultdict(list)
    if a.profile:
        os.makedirs(a.profile, exist_ok=True)
        for name, path in trees:
            for mode in modes:
                if mode == "flood":
                    continue
                out = Path(a.profile) / f"{name}-{mode}.txt"
                r = measure(
                    path, mode, a.seconds, a.warmup, profile_to=out, profile_hz=a.profile_hz
                )
                print(f"profile {name} {mode}: cpu {r['cpu_pct']:.2f}% (with py-spy attached)")
                print(summarise_profile(out), flush=True)
    for rnd in range(a.rounds):
        order = trees if rnd % 2 == 0 else trees[::-1]
        for mode in modes:
            for name, path in order:
                r = measure(path, mode, a.seconds, a.warmup)
                results[(name, mode)].append(r)
                print(f"round {rnd + 1} {mode:6s} {name:5s} {json.dumps(r)}", flush=True)
    print(
        f"\nmedians of {a.rounds} rounds, {a.seconds:.0f} s each, cpus {os.cpu_count()}, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    for mode in modes:
        row = []
        for name, _ in trees:
            rs = results[(name, mode)]
            if not rs:
                continue
            cpu = statistics.median(r["cpu_pct"] for r in rs)
            rss = statistics.median(r["peak_rss_mb"] for r in rs)
            row.append((name, cpu, rss))
            cpus = ", ".join(f"{r['cpu_pct']:.2f}" for r in rs)
            rsss = ", ".join(f"{r['peak_rss_mb']:.0f}" for r in rs)
            print(
                f"  {mode:6s} {name:5s} cpu {cpu:6.2f}% of a core (runs {cpus}), "
                f"peak RSS {rss:.0f} MB (runs {rsss})"
            )
        if len(row) == 2 and row[0][1] > 0:
            print(
                f"  {mode:6s} {row[1][0]}/{row[0][0]}: cpu x{row[1][1] / row[0][1]:.2f}, "
                f"rss x{row[1][2] / row[0][2]:.2f}"
            )
    if a.json:
        Path(a.json).write_text(
            json.dumps({f"{k[0]}:{k[1]}": v for k, v in results.items()}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
