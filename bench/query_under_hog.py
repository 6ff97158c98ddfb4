"""How long a user waits for the daemon while nice-0 work fills every CPU.

The daemon's background work runs at idle priority so that it never takes a
CPU from the engine (docs/footprint.md). A user's request is different:
someone is waiting for `stallscope query`, `stallscope status` or a
Prometheus scrape, and on a saturated host (when they most want an answer)
idle-priority work gets ~0.3% of a CPU. This bench starts a real daemon with
its API socket and `--metrics-listen`, stores some spans, then times the
same requests (a small `Query`, `status`, a scrape) in interleaved rounds
with no hog and with `stress-ng --cpu N` on every CPU (N = CPU count), and
prints the median and maximum per request kind and arm. Usage:
python bench/query_under_hog.py [--rounds 5] [--requests 5]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import probe_client
from stallscope.api.client import Client
from stallscope.demo.child import DaemonChild


def metrics_port(log_path, timeout_s=30):
    """The port the daemon's log says its metrics endpoint listens on."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in Path(log_path).read_text().splitlines():
            if "metrics serving on http://" in line:
                where = line.split("metrics serving on http://")[1].split("/")[0]
                return int(where.rsplit(":", 1)[1])
        time.sleep(0.1)
    raise SystemExit("the daemon's log never said where its metrics listen")


def timed(fn):
    t0 = time.monotonic()
    try:
        fn()
    except Exception as exc:  # a timeout is a result here, not a crash
        return time.monotonic() - t0, type(exc).__name__
    return time.monotonic() - t0, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=5, help="of each kind, per round and arm")
    ap.add_argument("--timeout", type=float, default=30.0, help="a scrape's timeout, seconds")
    ap.add_argument("--hog-s", type=float, default=30.0, help="the hog ends after this long")
    a = ap.parse_args()
    stress = shutil.which("stress-ng")
    if stress is None:
        raise SystemExit("needs stress-ng (scripts/bootstrap.sh installs it)")
    tmp = Path(tempfile.mkdtemp(prefix="stallscope-bench-"))
    api = str(tmp / "api.sock")
    daemon = DaemonChild(
        tmp / "probe.sock",
        tmp / "bench.duckdb",
        tmp / "daemon.log",
        [
            "--sched-backend",
            "none",
            "--gpu-backend",
            "none",
            "--api-socket",
            api,
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    ).start()
    port = metrics_port(daemon.log)
    probe = probe_client.connect(socket_path=daemon.socket, run_label="hogbench", gc=False)
    for _ in range(20_000):
        probe.end("step", probe.begin())
    probe.close()
    client = Client(api)
    client.wait_ready()
    kinds = {
        "query": lambda: client.query("SELECT count(*), max(end_ns) FROM spans"),
        "status": client.status,
        "scrape": lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=a.timeout
        ).read(),
    }
    took = {(k, arm): [] for k in kinds for arm in ("quiet", "hog")}
    errors = {}
    ncpu = len(os.sched_getaffinity(0))
    try:
        for r in range(a.rounds):
            for arm in ("quiet", "hog") if r % 2 == 0 else ("hog", "quiet"):
                hog = None
                if arm == "hog":
                    hog = subprocess.Popen(
                        # Bounded: a request starved for longer reads as this long.
                        [stress, "--cpu", str(ncpu), "--timeout", f"{a.hog_s:.0f}s", "--quiet"],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    time.sleep(1.0)  # the hog has the CPUs
                try:
                    for _ in range(a.requests):
                        for kind, fn in kinds.items():
                            s, err = timed(fn)
                            took[(kind, arm)].append(s)
                            if err:
                                errors[(kind, arm)] = errors.get((kind, arm), 0) + 1
                finally:
                    if hog is not None and hog.poll() is not None:
                        print("  the hog ended before the requests did: figures are capped")
                    if hog is not None:
                        hog.terminate()
                        hog.wait()
            print(f"round {r + 1} of {a.rounds} done", flush=True)
    finally:
        client.close()
        daemon.stop()
    print(
        f"\n{ncpu} CPUs; hog: stress-ng --cpu {ncpu} (nice 0); {a.requests} requests "
        f"of each kind per round and arm, {a.rounds} rounds"
    )
    print(f"{'request':8} {'arm':6} {'median ms':>10} {'max ms':>10} {'failed':>7}")
    for (kind, arm), values in took.items():
        print(
            f"{kind:8} {arm:6} {statistics.median(values) * 1e3:10.1f} "
            f"{max(values) * 1e3:10.1f} {errors.get((kind, arm), 0):7d}"
        )


if __name__ == "__main__":
    main()
