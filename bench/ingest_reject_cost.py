"""Daemon CPU per datagram: accepted vs rejected, same sizes, same socket.

Starts a real daemon and, one kind at a time, sends N datagrams over one
connection as fast as the socket takes them, waits until the daemon has read
them all (nothing left queued on the socket, TIOCOUTQ) and has decoded and
written them (its CPU time stops moving), and divides the daemon's CPU time
(utime+stime from /proc, idle rate subtracted) by N. Accepted datagrams
carry 16 or 511 span records with correct sequence numbers; rejected ones
are the same sizes with one defect each (no HELLO, bad magic, bad version,
length mismatch, sequence regress, bad HELLO JSON), or come one per short
connection (`conn_no_hello`; `hello_then_bad`: a valid HELLO, so a run, then
a bad datagram), N/10 of those. The fair reader must
not make rejecting cost more than accepting. Usage:
python bench/ingest_reject_cost.py [--datagrams N] [--repeat R]
"""

import argparse
import fcntl
import json
import os
import socket
import statistics
import struct
import sys
import tempfile
import termios
import time
from pathlib import Path

from probe_client import wire
from stallscope.demo.child import DaemonChild

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def outq(sock):
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]


def hdr(kind, count=0, first_seq=0, magic=wire.MAGIC, version=wire.VERSION):
    return wire.HEADER.pack(magic, version, kind, count, 32, first_seq, time.monotonic_ns(), 0, 0)


def records(n):
    return b"".join(wire.RECORD.pack(wire.REC_SPAN, 0, 0, 1, 10, 20, 0, 1) for _ in range(n))


def hello(token):
    body = json.dumps({"run_token": token, "label": f"reject-bench-{token}"}).encode()
    return hdr(wire.DGRAM_HELLO) + body


def datagrams(kind, n, size, token):
    """(prologue, list of datagrams) for one kind."""
    recs = records(size)
    if kind == "accepted":
        return [hello(token)], [
            hdr(wire.DGRAM_RECORDS, size, first_seq=i * size) + recs for i in range(n)
        ]
    if kind == "no_hello":
        return [], [hdr(wire.DGRAM_RECORDS, size) + recs] * n
    if kind == "bad_magic":
        return [], [hdr(wire.DGRAM_RECORDS, size, magic=0x1234) + recs] * n
    if kind == "bad_version":
        return [], [hdr(wire.DGRAM_RECORDS, size, version=250) + recs] * n
    if kind == "length_mismatch":
        return [hello(token)], [hdr(wire.DGRAM_RECORDS, size + 1) + recs] * n
    if kind == "seq_regress":
        pro = [hello(token), hdr(wire.DGRAM_RECORDS, size, first_seq=10**6) + recs]
        return pro, [hdr(wire.DGRAM_RECORDS, size, first_seq=5) + recs] * n
    if kind == "bad_hello":
        return [], [hdr(wire.DGRAM_HELLO) + b"{" + b'"a":' * (size * 8)] * n
    raise ValueError(kind)


def settle(pid, quiet_s=0.4, step_s=0.1):
    """Wait until the daemon's CPU time stops moving (decode and writes done)."""
    last = cpu_s(pid)
    still = 0.0
    while still < quiet_s:
        time.sleep(step_s)
        now = cpu_s(pid)
        still = still + step_s if now - last < 0.015 else 0.0
        last = now


def run_sessions(d, kind, n, size, token, idle_rate):
    """One short connection per datagram: connect, (HELLO,) one bad
    datagram, close. The cost per datagram includes accept and close."""
    recs = records(size)
    settle(d.proc.pid)
    c0, t0 = cpu_s(d.proc.pid), time.monotonic()
    for i in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(d.socket)
        if kind == "hello_then_bad":
            s.send(hello(token * 1_000_000 + i))
            s.send(hdr(wire.DGRAM_RECORDS, size + 1) + recs)
        else:
            s.send(hdr(wire.DGRAM_RECORDS, size) + recs)
        s.close()
    settle(d.proc.pid)
    c1, t1 = cpu_s(d.proc.pid), time.monotonic()
    return max(0.0, (c1 - c0) - idle_rate * (t1 - t0)) / n


def run_kind(d, kind, n, size, token, idle_rate):
    if kind in ("conn_no_hello", "hello_then_bad"):
        return run_sessions(d, kind, n // 10, size, token, idle_rate)
    pro, dgrams = datagrams(kind, n, size, token)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(d.socket)
    for p in pro:
        s.send(p)
    settle(d.proc.pid)
    c0, t0 = cpu_s(d.proc.pid), time.monotonic()
    for dg in dgrams:
        s.send(dg)
    while outq(s):
        time.sleep(0.005)
    settle(d.proc.pid)
    c1, t1 = cpu_s(d.proc.pid), time.monotonic()
    s.close()
    return max(0.0, (c1 - c0) - idle_rate * (t1 - t0)) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datagrams", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", default="16,511")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stallscope-reject-"))
    d = DaemonChild(
        tmp / "probe.sock",
        tmp / "bench.duckdb",
        tmp / "daemon.log",
        ["--sched-backend", "none", "--gpu-backend", "none", "--no-kernel-causes"],
    ).start()
    try:
        settle(d.proc.pid)
        c0, t0 = cpu_s(d.proc.pid), time.monotonic()
        time.sleep(2.0)
        idle_rate = (cpu_s(d.proc.pid) - c0) / (time.monotonic() - t0)
        kinds = ["accepted", "no_hello", "bad_magic", "bad_version", "length_mismatch"]
        kinds += ["seq_regress", "bad_hello", "conn_no_hello", "hello_then_bad"]
        token = 1
        print(
            f"datagrams per kind {a.datagrams}, repeats {a.repeat}, daemon idle "
            f"{idle_rate * 1000:.1f} ms CPU/s, python {sys.version.split()[0]}, "
            f"cpus {os.cpu_count()}"
        )
        print(f"{'records':>7}  {'kind':<16} {'us CPU per datagram (median)':>28}  runs")
        for size in (int(x) for x in a.sizes.split(",")):
            for kind in kinds:
                runs = []
                for _ in range(a.repeat):
                    token += 1
                    runs.append(run_kind(d, kind, a.datagrams, size, token, idle_rate) * 1e6)
                print(
                    f"{size:>7}  {kind:<16} {statistics.median(runs):>28.1f}  "
                    + " ".join(f"{r:.1f}" for r in runs)
                )
    finally:
        d.stop()


if __name__ == "__main__":
    main()
