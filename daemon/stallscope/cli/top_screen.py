"""`stallscope top`: a live terminal dashboard over the daemon's event stream.

A plain client of the public API (StreamEvents and GetStatus, nothing
private): steps per second and p50/p99 step time per stage, recent stalls
with their cause, GC passes per generation, GPU SM clock and clock-event
reasons, and what the stream lost. On a terminal it redraws about twice a
second with ANSI escapes (no curses); when stdout is not a terminal it
prints a snapshot every few seconds, so it can be logged or piped. It never
writes anything but stdout, and never slows the daemon: if it reads too
slowly it loses events (shown as "stream lost").
"""

import math
import os
import sys
import threading
import time
from collections import defaultdict, deque

import grpc

from stallscope.api.client import ApiError, Client
from stallscope.api.v1 import stallscope_pb2 as pb
from stallscope.vocab import rules

WINDOW_NS = 10_000_000_000  # percentiles over the last 10 s of steps
RATE_WINDOW_NS = 5_000_000_000  # steps/s over the last 5 s
TTY_REFRESH_S = 0.5
PIPE_REFRESH_S = 2.0
RECENT_STALLS = 8

GPU_REASONS = {
    0x1: "idle",
    0x2: "app-clocks",
    0x4: "sw-power",
    0x8: "hw-slowdown",
    0x10: "sync-boost",
    0x20: "sw-thermal",
    0x40: "hw-thermal",
    0x80: "power-brake",
    0x100: "display",
    0x200: "board-limit",
    0x400: "reliability",
}


def _pct(sorted_values, q):
    """Nearest-rank percentile (q in 0..1) of an already sorted list."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _ms(ns):
    return "-" if ns is None else f"{ns / 1e6:.2f}"


def reasons_text(bits):
    names = [name for bit, name in GPU_REASONS.items() if bits & bit]
    return ",".join(names) if names else "none"


class Dashboard:
    """What the stream has shown so far; `render()` makes one frame."""

    def __init__(self):
        self._lock = threading.Lock()
        self.steps = defaultdict(
            deque
        )  # stage -> deque of (end_ns, duration_ns), idle steps excluded
        self.idle_steps = defaultdict(int)  # stage -> idle steps since start (rules.is_idle)
        self.reports_batch = set()  # (run_id, tid) that sent a batch size > 0
        self.gc = deque()  # (end_ns, generation, duration_ns)
        self.stalls = deque(maxlen=RECENT_STALLS)
        self.stalls_total = 0
        self.gpus = {}  # gpu -> GpuSample
        self.gpu_min_sm = {}  # gpu -> min SM clock in the window (MHz)
        self.dropped = 0
        self.events = 0
        self.clock_offset_ns = None  # daemon clock - local clock
        self.error = None

    def now_ns(self):
        return time.monotonic_ns() + (self.clock_offset_ns or 0)

    def add(self, batch):
        local = time.monotonic_ns()
        with self._lock:
            if batch.sent_ns:
                offset = batch.sent_ns - local
                # The smallest offset seen is the least delayed message.
                if self.clock_offset_ns is None or offset < self.clock_offset_ns:
                    self.clock_offset_ns = offset
            for ev in batch.events:
                which = ev.WhichOneof("payload")
                self.events += 1
                if which == "span":
                    s = ev.span
                    if s.batch:
                        self.reports_batch.add((s.run_id, s.tid))
                    if rules.is_idle(s.batch, False, (s.run_id, s.tid) in self.reports_batch):
                        self.idle_steps[s.stage or "-"] += 1  # out of rates and percentiles
                        continue
                    self.steps[s.stage or "-"].append((s.end_ns, s.duration_ns))
                elif which == "gc_pass":
                    g = ev.gc_pass
                    self.gc.append((g.end_ns, g.generation, g.duration_ns))
                elif which == "stall_alert":
                    self.stalls.append(ev.stall_alert)
                    self.stalls_total += 1
                elif which == "gpu_sample":
                    g = ev.gpu_sample
                    if g.source != "buffer":  # buffered samples carry clocks only
                        self.gpus[g.gpu] = g
                    if g.sm_clock_mhz >= 0:
                        low = self.gpu_min_sm.get(g.gpu)
                        self.gpu_min_sm[g.gpu] = (
                            g.sm_clock_mhz if low is None else min(low, g.sm_clock_mhz)
                        )
                elif which == "dropped":
                    self.dropped += ev.dropped.count
            self._prune(self.now_ns())

    def _prune(self, now_ns):
        cutoff = now_ns - WINDOW_NS
        for q in self.steps.values():
            while q and q[0][0] < cutoff:
                q.popleft()
        while self.gc and self.gc[0][0] < cutoff:
            self.gc.popleft()

    def render(self, width=100):
        with self._lock:
            now = self.now_ns()
            self._prune(now)
            lines = [
                f"stallscope top   events {self.events}   stream lost {self.dropped}"
                + (f"   ERROR {self.error}" if self.error else ""),
                "",
            ]
            lines.append(
                f"{'stage':<16}{'steps/s':>10}{'p50 ms':>10}{'p99 ms':>10}"
                f"{'max ms':>10}{'n (10 s)':>10}{'idle':>8}   (steps/s over 5 s; idle steps apart)"
            )
            for stage in sorted(self.steps):
                q = self.steps[stage]
                durs = sorted(d for _, d in q)
                recent = sum(1 for end, _ in q if end >= now - RATE_WINDOW_NS)
                lines.append(
                    f"{stage[:15]:<16}{recent / (RATE_WINDOW_NS / 1e9):>10.1f}"
                    f"{_ms(_pct(durs, 0.5)):>10}{_ms(_pct(durs, 0.99)):>10}"
                    f"{_ms(durs[-1] if durs else None):>10}{len(durs):>10}"
                    f"{self.idle_steps.get(stage, 0):>8}"
                )
            if not self.steps:
                lines.append("(no steps yet: is a probe client connected?)")
            lines.append("")
            per_gen = defaultdict(list)
            for _, gen, dur in self.gc:
                per_gen[gen].append(dur)
            gc_text = (
                "   ".join(
                    f"gen{g}: {len(d)} passes, max {_ms(max(d))} ms"
                    for g, d in sorted(per_gen.items())
                )
                or "none"
            )
            lines.append(f"GC (10 s): {gc_text}")
            for gpu in sorted(self.gpus):
                g = self.gpus[gpu]

                def known(v, unit):
                    return f"{v}{unit}" if v >= 0 else "?"

                power = f"{g.power_mw / 1000:.0f} W" if g.power_mw >= 0 else "?"
                lines.append(
                    f"GPU {gpu}: SM {known(g.sm_clock_mhz, ' MHz')} (min "
                    f"{self.gpu_min_sm.get(gpu)} since start)  mem "
                    f"{known(g.mem_clock_mhz, ' MHz')}  power {power}  "
                    f"{known(g.temp_c, ' C')}  util {known(g.util_pct, '%')}  "
                    f"reasons {reasons_text(g.clock_event_reasons)}"
                )
            if not self.gpus:
                lines.append("GPU: no samples (no GPU probe, or no GPU)")
            lines.append("")
            lines.append(
                f"stalls (step > baseline x {rules.SLOW_FACTOR:g}): {self.stalls_total} since start, "
                f"latest {len(self.stalls)}:"
            )
            for a in reversed(self.stalls):
                age_s = (now - a.end_ns) / 1e9
                extra = []
                if a.gc_overlap_ns:
                    extra.append(f"gc {a.gc_overlap_ns / 1e6:.1f} ms (gen{a.gc_generation})")
                if a.offcpu_ns:
                    extra.append(
                        f"off-cpu {a.offcpu_ns / 1e6:.1f} ms (preempted {a.preempted_ns / 1e6:.1f})"
                    )
                lines.append(
                    f"  {age_s:6.1f}s ago  run {a.run_id} {a.stage or '-'}/b{a.batch}  "
                    f"{a.duration_ns / 1e6:.1f} ms vs {a.baseline_ns / 1e6:.1f} ms "
                    f"(x{a.ratio:.1f})  {a.cause}  {'  '.join(extra)}"
                )
        return "\n".join(line[:width] for line in lines) + "\n"


def _width(out):
    """Terminal columns; a terminal that reports none (0) gets $COLUMNS or 100."""
    try:
        cols = os.get_terminal_size(out.fileno()).columns
    except OSError:
        cols = 0
    if cols <= 0:
        cols = int(os.environ.get("COLUMNS", "0") or 0) or 100
    return max(cols, 40)


def _reader(stream, board, done):
    try:
        for batch in stream:
            board.add(batch)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.CANCELLED:
            board.error = exc.details() or str(exc.code())
    finally:
        done.set()


def run(api_socket, duration_s=None, out=None, target=None):
    """Run the dashboard until Ctrl-C, `duration_s`, or the daemon goes away."""
    out = out or sys.stdout
    client = Client(api_socket) if target is None else Client(target=target)
    try:
        client.wait_ready(timeout_s=5)
    except ApiError as exc:
        print(
            f"error: {exc} (is the daemon running with --api-socket {api_socket}?)", file=sys.stderr
        )
        return 2
    board = Dashboard()
    stream = client.events(
        kinds=[pb.SPAN, pb.GC_PASS, pb.GPU_SAMPLE, pb.STALL_ALERT], span_kinds=["step"]
    )
    done = threading.Event()
    threading.Thread(target=_reader, args=(stream, board, done), daemon=True).start()
    tty = out.isatty()
    refresh_s = TTY_REFRESH_S if tty else PIPE_REFRESH_S
    end = time.monotonic() + duration_s if duration_s else None
    try:
        while True:
            wait = refresh_s if end is None else max(0.0, min(refresh_s, end - time.monotonic()))
            done.wait(wait)
            width = _width(out) if tty else 160
            frame = board.render(width)
            if tty:
                out.write("\x1b[H\x1b[2J" + frame)
            else:
                out.write(f"--- {time.strftime('%H:%M:%S')}\n{frame}\n")
            out.flush()
            if done.is_set() or (end is not None and time.monotonic() >= end):
                break
    except KeyboardInterrupt:
        pass
    finally:
        stream.cancel()
        client.close()
    if board.error:
        print(f"error: the event stream ended: {board.error}", file=sys.stderr)
        return 1
    return 0
