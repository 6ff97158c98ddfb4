"""What `--metrics-listen` costs ingest: records per daemon CPU-second and the
wall-clock rate, with and without /metrics, side by side.

Each round starts a real daemon per arm (the arms' order alternates between
rounds), replays pre-built span datagrams from C sender processes for D
seconds exactly as bench/ingest_throughput.py does (every span is a "step",
so every record goes through the step histograms: the worst case for the
metrics listener), and in the arms with /metrics scrapes it every
--scrape-s seconds meanwhile (Prometheus' default is 15 s; 1 s by default
here, to charge the scrape side too). Arms: off, metrics, api (the gRPC API,
whose live stall detector the metrics then share), api+metrics. Reports
per-arm medians and the ratios metrics/off and api+metrics/api.
Usage: python bench/metrics_cost.py [--rounds R] [--seconds D] [--senders C]
[--scrape-s S] [--rate RECORDS_PER_S] [--arms off,metrics,...]
"""

import argparse
import multiprocessing as mp
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from ingest_throughput import cpu_seconds, sender
from stallscope.demo.child import DaemonChild

BASE_ARGS = ["--sched-backend", "none", "--gpu-backend", "none", "--no-kernel-causes"]


def _scraper(port, every_s, stop, scrapes):
    while not stop.wait(every_s):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                r.read()
            scrapes.append(1)
        except OSError:
            pass


ARMS = ("off", "metrics", "api", "api+metrics")
# The ratios reported: (with, without).
PAIRS = (("metrics", "off"), ("api+metrics", "api"))


def one(arm, a, tmp):
    args = list(BASE_ARGS)
    if "metrics" in arm:
        args += ["--metrics-listen", "127.0.0.1:0"]
    if "api" in arm:
        args += ["--api-socket", str(tmp / "api.sock")]
    d = DaemonChild(tmp / "probe.sock", tmp / "b.duckdb", tmp / "daemon.log", args).start()
    stop, scrapes = threading.Event(), []
    if "metrics" in arm:
        port = int(re.search(r"metrics serving on http://\S+:(\d+)/", d.new_log()).group(1))
        threading.Thread(target=_scraper, args=(port, a.scrape_s, stop, scrapes)).start()
    pid = d.proc.pid
    cpu0 = cpu_seconds(pid)
    q = mp.Queue()
    t0 = time.monotonic()
    procs = [
        mp.Process(target=sender, args=(d.socket, a.seconds, i + 1, q, a.rate / a.senders))
        for i in range(a.senders)
    ]
    for p in procs:
        p.start()
    sent = sum(q.get() for _ in procs)
    for p in procs:
        p.join()
    wall = time.monotonic() - t0
    time.sleep(0.5)
    cpu = cpu_seconds(pid) - cpu0
    stop.set()
    rc, _ = d.stop(timeout_s=60)
    stored = d.scalar("SELECT count(*) FROM spans")
    for f in tmp.iterdir():
        if f.is_file():
            f.unlink()
    return {
        "per_cpu_s": stored / max(cpu, 1e-9),
        "wall_rate": sent / wall,
        "stored_all": stored == sent,
        "rc": rc,
        "scrapes": len(scrapes),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--senders", type=int, default=2)
    ap.add_argument("--scrape-s", type=float, default=1.0)
    ap.add_argument("--rate", type=float, default=0.0, help="records/s in all (0: saturate)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"some of {','.join(ARMS)}")
    a = ap.parse_args()
    arms = a.arms.split(",")
    results = {arm: [] for arm in arms}
    for r in range(a.rounds):
        for arm in arms if r % 2 == 0 else arms[::-1]:
            tmp = Path(tempfile.mkdtemp(prefix=f"stallscope-bench-{arm}-"))
            got = one(arm, a, tmp)
            results[arm].append(got)
            print(
                f"round {r + 1} {arm:11s}: {got['per_cpu_s']:>12,.0f} records/CPU-s, "
                f"{got['wall_rate']:>12,.0f} records/s wall, scrapes {got['scrapes']}, "
                f"all stored {got['stored_all']}, exit {got['rc']}",
                flush=True,
            )
    print(
        f"senders {a.senders}, {a.seconds:g} s a run, {a.rounds} rounds, offered "
        f"{f'{a.rate:,.0f} records/s' if a.rate else 'max'}, "
        f"scrape every {a.scrape_s:g} s, cpus {os.cpu_count()}"
    )
    med = {}
    for arm, rows in results.items():
        med[arm] = {k: statistics.median(x[k] for x in rows) for k in ("per_cpu_s", "wall_rate")}
        print(
            f"  {arm:11s} median: {med[arm]['per_cpu_s']:,.0f} records per CPU-second, "
            f"{med[arm]['wall_rate']:,.0f} records/s wall"
        )
    for on, off in PAIRS:
        if on in med and off in med:
            print(
                f"  ratio {on}/{off}: {med[on]['per_cpu_s'] / med[off]['per_cpu_s']:.3f} "
                f"(per CPU-second), {med[on]['wall_rate'] / med[off]['wall_rate']:.3f} (wall)"
            )
    ok = all(x["stored_all"] and x["rc"] == 0 for rows in results.values() for x in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
