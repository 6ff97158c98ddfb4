"""Daemon ingest: records per second per CPU-second, and peak RSS.

Starts a real daemon, then C sender processes that replay pre-built
datagrams (127 span records each, correct headers and sequence numbers) as
fast as the socket takes them for D seconds. Reports records stored, the
daemon's CPU seconds (utime+stime from /proc) and therefore records per
CPU-second (= per core), the wall-clock rate, and the daemon's peak RSS
(VmHWM). Usage: python bench/ingest_throughput.py [--senders C] [--seconds D]
"""

import argparse
import json
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from probe_client import wire
from stallscope.demo.child import DaemonChild


def sender(path, seconds, token, out, rate=0.0):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    hello = json.dumps({"run_token": token, "label": f"bench-{token}"}).encode()
    s.send(wire.HEADER.pack(wire.MAGIC, wire.VERSION, wire.DGRAM_HELLO, 0, 32, 0, 0, 0, 0) + hello)
    names = b"".join(
        wire.STRING_RECORD.pack(wire.REC_STRING, 0, i + 1, 0, n)
        for i, n in enumerate([b"step", b"recurrent"])
    )
    s.send(
        wire.HEADER.pack(wire.MAGIC, wire.VERSION, wire.DGRAM_RECORDS, 2, 32, 0, 0, 0, 0) + names
    )
    n = wire.MAX_RECORDS
    buf = bytearray(wire.HEADER_SIZE + n * 32)
    for i in range(n):
        wire.RECORD.pack_into(
            buf, 32 + i * 32, wire.REC_SPAN, 0, 1, os.getpid(), 1000 + i, 2000 + i, 2, 3
        )
    seq, start = 0, time.monotonic()
    end = start + seconds
    while time.monotonic() < end:
        if rate and seq > rate * (time.monotonic() - start):
            time.sleep(0.001)
            continue
        wire.HEADER.pack_into(
            buf, 0, wire.MAGIC, wire.VERSION, wire.DGRAM_RECORDS, n, 32, seq, 0, 0, 0
        )
        s.send(buf)  # blocking: measures what the daemon takes, not drops
        seq += n
    s.close()
    out.put(seq)


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


INGEST_ONLY = (
    "--sched-backend none --gpu-backend none --no-kernel-causes --no-cpu-sampler --no-cuda-driver"
).split()


def peak_rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="records/s in all (0: as fast as the daemon takes them)",
    )
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stallscope-bench-"))
    d = DaemonChild(
        tmp / "probe.sock",
        tmp / "bench.duckdb",
        tmp / "daemon.log",
        # ingest alone: no kernel probes (the CPU sampler would sample the
        # senders, at a cost, and count their stacks it cannot read as losses)
        INGEST_ONLY,
    ).start()
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
    rss = peak_rss_mb(pid)
    rc, stop_s = d.stop(timeout_s=60)
    stored = d.scalar("SELECT count(*) FROM spans")
    lost = d.scalar("SELECT coalesce(sum(count), 0) FROM losses")
    print(
        f"senders {a.senders}, {a.seconds:.0f} s, offered "
        f"{'max' if not a.rate else f'{a.rate:,.0f} records/s'}, cpus {os.cpu_count()}"
    )
    print(
        f"  sent {sent} records, stored {stored}, known lost {lost}, daemon exit {rc} "
        f"(stop took {stop_s:.2f} s)"
    )
    print(
        f"  wall rate {sent / wall:,.0f} records/s; daemon CPU {cpu:.2f} s -> "
        f"{stored / max(cpu, 1e-9):,.0f} records per CPU-second; peak RSS {rss:.0f} MB"
    )
    return 0 if stored + lost == sent else 1


if __name__ == "__main__":
    sys.exit(main())
