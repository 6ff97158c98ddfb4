"""gRPC API: marker-to-subscriber latency at a steady event rate, and Query rows/s.

Latency: a real daemon with its API on a Unix socket; an emitter process
(probe_client, stdlib only) ends RATE spans per second, paced every
millisecond; this process subscribes to StreamEvents (spans only) and, for
each span, takes `time.monotonic_ns()` when its message arrives minus the
span's `end_ns` (the marker: the client's monotonic clock, same host). It
also splits that into daemon side (`EventBatch.sent_ns - end_ns`: client
buffering + ingest decode cadence + fan-out) and transport (`arrival -
sent_ns`). The first second is discarded. Run once with the daemon as it
ships (decode every 100 ms) and once with decode every 20 ms
(`--decode-ms`), side by side, to show what the pipeline's cadence costs.
`--base DIR` (a checkout of an older commit, e.g. `git worktree add
/tmp/api_base 713b38b`) adds that commit's daemon as it shipped, run
interleaved with this one `--repeat` times, so old and new are measured in
the same conditions; the table then gives the median of the repeats.

Query: after the latency run, `SELECT *` of the stored spans and of a
synthetic 2,000,000-row, 4-column result, through Query in ARROW_IPC and in
protobuf ROWS, against the same SQL in an in-process DuckDB (no API) as the
reference. Usage: python bench/api_latency.py [--rate 10000] [--seconds 10]
"""

import argparse
import multiprocessing as mp
import os
import tempfile
import threading
import time
from pathlib import Path

import duckdb
import numpy as np

from stallscope.api.client import Client
from stallscope.api.v1 import stallscope_pb2 as pb
from stallscope.demo.child import DaemonChild


def emitter(socket_path, rate, seconds, go, out, client_flush_ms=0):
    import probe_client

    if client_flush_ms:
        # The probe sends a thread's buffer when its oldest span is this old
        # (20 ms as shipped): a shorter one shows the daemon's own share.
        from probe_client import _probe, _transport

        interval_ns = int(client_flush_ms * 1e6)
        _probe._CONSTS["interval"] = _probe.FLUSH_INTERVAL_NS = interval_ns
        _transport.FLUSH_INTERVAL_NS = interval_ns

    probe = probe_client.connect(socket_path=socket_path, run_label="latency", gc=False)
    go.wait()
    per_ms = rate / 1000.0
    start = time.monotonic_ns()
    end = start + int(seconds * 1e9)
    sent = 0
    while True:
        now = time.monotonic_ns()
        if now >= end:
            break
        due = int((now - start) / 1e6 * per_ms)
        while sent < due:
            t0 = probe.begin()
            probe.end("step", t0, stage="bench", batch=1)
            sent += 1
        time.sleep(0.0005)
    probe.close()
    out.put((sent, probe.stats()))


def start_daemon(tmp, decode_ms, base=None):
    sock, api, db = (Path(tmp) / n for n in ("probe.sock", "api.sock", "bench.duckdb"))
    preamble = ""
    if base:  # an older checkout's daemon (its own sources first on the path)
        preamble += f"import sys; sys.path[:0] = [{str(Path(base) / 'daemon')!r}, {str(base)!r}]\n"
    if decode_ms > 0:  # 0: the daemon's own policy (live decode while subscribed)
        preamble += (
            "import stallscope.service.server as server\n"
            f"server.DECODE_INTERVAL_S = server.LIVE_DECODE_INTERVAL_S = {decode_ms / 1000.0!r}\n"
            "server.LIVE_DECODE_MIN_S = server.DECODE_INTERVAL_S\n"
        )
    preamble = preamble or None
    args = ["--api-socket", str(api), "--sched-backend", "none", "--gpu-backend", "none"]
    daemon = DaemonChild(sock, db, Path(tmp) / "daemon.log", args, preamble=preamble).start()
    return daemon, str(sock), str(api)


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(a, q):
    return float(np.percentile(a, q)) if len(a) else float("nan")


def latency_run(rate, seconds, decode_ms, subscribe=True, base=None, query=True, client_flush_ms=0):
    with tempfile.TemporaryDirectory() as tmp:
        daemon, sock, api = start_daemon(tmp, decode_ms, base)
        client = Client(api)
        client.wait_ready()
        total, daemon_side, transport = [], [], []
        received = [0]
        dropped = [0]
        stream = client.events(kinds=[pb.SPAN])

        def read():
            try:
                for batch in stream:
                    now = time.monotonic_ns()
                    for ev in batch.events:
                        if ev.HasField("dropped"):
                            dropped[0] += ev.dropped.count
                            continue
                        received[0] += 1
                        total.append(now - ev.span.end_ns)
                        daemon_side.append(batch.sent_ns - ev.span.end_ns)
                        transport.append(now - batch.sent_ns)
            except Exception:
                pass

        if subscribe:
            threading.Thread(target=read, daemon=True).start()
        time.sleep(0.5)
        ctx = mp.get_context("spawn")  # no fork after gRPC has started threads
        go, out = ctx.Event(), ctx.Queue()
        p = ctx.Process(target=emitter, args=(sock, rate, seconds, go, out, client_flush_ms))
        p.start()
        time.sleep(0.5)
        t_start = time.monotonic_ns()
        cpu0 = cpu_seconds(daemon.proc.pid)
        go.set()
        sent, stats = out.get(timeout=seconds + 60)
        p.join()
        cpu_pct = (
            100 * (cpu_seconds(daemon.proc.pid) - cpu0) / ((time.monotonic_ns() - t_start) / 1e9)
        )
        deadline = time.monotonic() + 10
        while (
            subscribe
            and received[0] + dropped[0] < stats["sent_records"]
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        stream.cancel()
        # discard the first second (connection warm-up)
        skip = min(len(total), int(rate))
        res = {
            "daemon": "base" if base else "this",
            "decode_ms": decode_ms,
            "client_flush_ms": client_flush_ms or 20,
            "rate": rate,
            "sent": sent,
            "subscribed": subscribe,
            "daemon_cpu_pct": cpu_pct,
            "client_drops": stats["drops_full"],
            "received": received[0],
            "stream_dropped": dropped[0],
            "p50_ms": pct(total[skip:], 50) / 1e6,
            "p99_ms": pct(total[skip:], 99) / 1e6,
            "max_ms": max(total[skip:]) / 1e6 if total[skip:] else float("nan"),
            "daemon_p50_ms": pct(daemon_side[skip:], 50) / 1e6,
            "daemon_p99_ms": pct(daemon_side[skip:], 99) / 1e6,
            "transport_p50_ms": pct(transport[skip:], 50) / 1e6,
            "transport_p99_ms": pct(transport[skip:], 99) / 1e6,
            "wall_s": (time.monotonic_ns() - t_start) / 1e9,
        }
        qres = query_runs(client) if query and decode_ms == 0 and subscribe and not base else None
        client.close()
        daemon.stop(timeout_s=30)
        return res, qres


SYNTH = (
    "SELECT range AS i, range * 2.5 AS x, 'stage-' || (range % 7) AS s, "
    "range % 3 = 0 AS b FROM range(2000000)"
)


def timed(fn, repeat=3):
    times, rows = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        rows = fn()
        times.append(time.perf_counter() - t0)
    return rows, float(np.median(times))


def query_runs(client):
    out = []
    for name, sql in (("stored spans", "SELECT * FROM spans"), ("synthetic 2M x 4", SYNTH)):

        def arrow(sql=sql):
            return client.query_arrow(sql, limit=10_000_000, timeout_ms=120_000)[0].num_rows

        def rows(sql=sql):
            n = 0
            for msg in client.stub.Query(
                pb.QueryRequest(sql=sql, max_rows=10_000_000, timeout_ms=120_000)
            ):
                n += len(msg.rows)
            return n

        n, t_arrow = timed(arrow)
        if name == "stored spans" or n <= 2_000_000:
            n2, t_rows = timed(rows, repeat=1)
        ref = duckdb.connect()
        if name == "stored spans":
            t_ref = None
        else:
            _, t_ref = timed(lambda ref=ref, sql=sql: ref.sql(sql).to_arrow_table().num_rows)
        out.append(
            {
                "result": name,
                "rows": n,
                "arrow_rows_s": n / t_arrow,
                "rows_rows_s": n2 / t_rows,
                "inprocess_rows_s": (n / t_ref) if t_ref else None,
            }
        )
    return out


def compare(args):
    """Base and this daemon as shipped (decode_ms 0), one subscriber,
    interleaved `repeat` times; then the per-key median of every figure,
    and each run's own row printed as it ends."""
    runs = {"base": [], "this": []}
    for i in range(args.repeat):
        order = ("base", "this") if i % 2 == 0 else ("this", "base")
        for who in order:
            res, _ = latency_run(
                args.rate,
                args.seconds,
                0,
                base=args.base if who == "base" else None,
                query=False,
                client_flush_ms=args.client_flush_ms,
            )
            runs[who].append(res)
            print(
                f"  repeat {i + 1} {who}: cpu {res['daemon_cpu_pct']:.0f}% "
                f"p50 {res['p50_ms']:.1f} p99 {res['p99_ms']:.1f} ms "
                f"(daemon p99 {res['daemon_p99_ms']:.1f}), lost "
                f"{res['client_drops'] + res['stream_dropped']}",
                flush=True,
            )
    out = []
    for rs in runs.values():
        med = dict(rs[0])
        for key, v in rs[0].items():
            if isinstance(v, float):
                med[key] = float(np.median([r[key] for r in rs]))
        out.append(med)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=10_000, help="spans per second")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument(
        "--decode-ms",
        type=int,
        action="append",
        default=None,
        help="daemon decode interval(s) to compare; 0 = as shipped (100 ms, "
        "20 ms while a subscriber is connected). Default: 0 and 100",
    )
    ap.add_argument("--base", help="checkout of an older commit to compare, side by side")
    ap.add_argument("--repeat", type=int, default=1, help="interleaved repeats (median shown)")
    ap.add_argument("--no-query", action="store_true", help="skip the Query throughput part")
    ap.add_argument(
        "--client-flush-ms",
        type=float,
        default=0,
        help="the probe's send interval in the emitter (0 = as shipped, 20 ms)",
    )
    args = ap.parse_args()
    results, qres = [], None
    if args.base:
        results = compare(args)
    else:
        # First the daemon's CPU with no subscriber, as the reference for what one costs.
        results.append(latency_run(args.rate, args.seconds, 100, subscribe=False)[0])
        for decode_ms in args.decode_ms or [0, 100]:
            res, q = latency_run(args.rate, args.seconds, decode_ms, query=not args.no_query)
            results.append(res)
            qres = qres or q
    print(
        f"latency, {args.rate:.0f} spans/s for {args.seconds:.0f} s, probe send interval "
        f"{args.client_flush_ms or 20:g} ms "
        "(marker end_ns -> subscriber arrival; first second dropped)"
    )
    print(
        f"{'daemon':>7}{'decode':>8}{'subs':>5}{'cpu%':>6}{'sent':>8}{'recv':>8}{'lost':>6}{'p50 ms':>9}"
        f"{'p99 ms':>9}{'max ms':>9}{'dmn p50':>9}{'dmn p99':>9}{'net p50':>9}{'net p99':>9}"
    )
    for r in results:
        print(
            f"{r['daemon']:>7}{r['decode_ms']:>6}ms{int(r['subscribed']):>5}{r['daemon_cpu_pct']:>6.0f}"
            f"{r['sent']:>8}{r['received']:>8}"
            f"{r['client_drops'] + r['stream_dropped']:>6}{r['p50_ms']:>9.1f}"
            f"{r['p99_ms']:>9.1f}{r['max_ms']:>9.1f}{r['daemon_p50_ms']:>9.1f}"
            f"{r['daemon_p99_ms']:>9.1f}{r['transport_p50_ms']:>9.2f}"
            f"{r['transport_p99_ms']:>9.2f}"
        )
    if qres:
        print("\nQuery throughput (median of 3; protobuf ROWS once)")
        print(
            f"{'result':<20}{'rows':>10}{'ARROW_IPC rows/s':>18}{'ROWS rows/s':>14}"
            f"{'in-process DuckDB rows/s':>26}"
        )
        for q in qres:
            ref = f"{q['inprocess_rows_s']:,.0f}" if q["inprocess_rows_s"] else "-"
            print(
                f"{q['result']:<20}{q['rows']:>10}{q['arrow_rows_s']:>18,.0f}"
                f"{q['rows_rows_s']:>14,.0f}{ref:>26}"
            )


if __name__ == "__main__":
    main()
