"""The scheduler's tick, as the CPU sampler's clock (`cpu_sample_clock = "tick"`).

What the tick-clocked sampler needs to know of the running kernel, read
once at start: CONFIG_HZ (how many ticks a second a busy CPU takes: the
sampling rate; from /proc/config.gz or /boot/config-RELEASE, else measured
from /proc/timer_list's jiffies), the address of the tick's hrtimer handler
(`tick_nohz_handler` since Linux 6.10, `tick_sched_timer` before) and the
address range of the local timer interrupt's entry (`asm_sysvec_apic_timer_
interrupt` up to the next symbol), from /proc/kallsyms, which shows
addresses to root (or CAP_SYSLOG) only. `unavailable()` says what is
missing and how to fix it; nothing here raises into the daemon otherwise.
"""

import bisect
import gzip
import os
import re
import time

TICK_HANDLERS = ("tick_nohz_handler", "tick_sched_timer")
IRQ_ENTRY = "asm_sysvec_apic_timer_interrupt"
TRACEPOINT = "timer:hrtimer_expire_entry"


class TickInfo:
    """hz, handler (address) and irq_entry (lo, hi) of the running kernel."""

    def __init__(self, hz, handler, irq_entry):
        self.hz = hz
        self.handler = handler
        self.irq_entry = irq_entry

    def cflags(self):
        lo, hi = self.irq_entry
        return [
            "-DTICK_CLOCK=1",
            f"-DTICK_FN={self.handler:#x}ULL",
            f"-DIRQ_ENTRY_LO={lo:#x}ULL",
            f"-DIRQ_ENTRY_HI={hi:#x}ULL",
        ]


def config_hz(proc_root="/proc", boot_root="/boot"):
    """CONFIG_HZ of the running kernel, or None when no source says it."""
    release = os.uname().release
    for path, opener in (
        (f"{proc_root}/config.gz", gzip.open),
        (f"{boot_root}/config-{release}", open),
    ):
        try:
            with opener(path, "rt") as f:
                for line in f:
                    m = re.match(r"CONFIG_HZ=(\d+)$", line.strip())
                    if m:
                        return int(m.group(1))
        except OSError:
            continue
    return _measured_hz(proc_root)


def _measured_hz(proc_root, wait_s=0.2):
    """jiffies per second from two reads of /proc/timer_list (None if unreadable)."""

    def jiffies():
        with open(f"{proc_root}/timer_list") as f:
            for line in f:
                if line.startswith("jiffies:"):
                    return int(line.split()[1])
        return None

    try:
        j0, t0 = jiffies(), time.monotonic()
        time.sleep(wait_s)
        j1, t1 = jiffies(), time.monotonic()
    except (OSError, ValueError):
        return None
    if j0 is None or j1 is None or j1 <= j0:
        return None
    rate = (j1 - j0) / (t1 - t0)
    return min((100, 250, 300, 1000), key=lambda hz: abs(hz - rate))


def kernel_symbols(names, proc_root="/proc"):
    """{name: (address, next symbol's address)} for `names` from kallsyms;
    addresses shown as 0 (no root, kptr_restrict) count as missing."""
    want = set(names)
    found = {}
    addrs = []
    try:
        with open(f"{proc_root}/kallsyms") as f:
            for line in f:
                parts = line.split(None, 3)
                if len(parts) < 3 or parts[1] not in "tT":
                    continue
                addr = int(parts[0], 16)
                addrs.append(addr)
                if parts[2] in want and addr:
                    found[parts[2]] = addr
    except OSError:
        return {}
    addrs.sort()
    out = {}
    for name, addr in found.items():
        i = bisect.bisect_right(addrs, addr)
        out[name] = (addr, addrs[i] if i < len(addrs) else addr + 4096)
    return out


def tick_info(proc_root="/proc", tracing_root="/sys/kernel/tracing"):
    """(TickInfo, None) or (None, why it cannot be had and how to fix it)."""
    category, _, event = TRACEPOINT.partition(":")
    if not os.path.isdir(f"{tracing_root}/events/{category}/{event}"):
        return None, (
            f"the tracepoint {TRACEPOINT} is not in {tracing_root} (mount tracefs there, "
            "or use cpu_sample_clock = 'timer')"
        )
    syms = kernel_symbols((*TICK_HANDLERS, IRQ_ENTRY), proc_root)
    handler = next((syms[n][0] for n in TICK_HANDLERS if n in syms), None)
    if handler is None or IRQ_ENTRY not in syms:
        return None, (
            f"{proc_root}/kallsyms does not show {' or '.join(TICK_HANDLERS)} and {IRQ_ENTRY} "
            "(needs root or CAP_SYSLOG, kernel.kptr_restrict <= 1, x86-64): use "
            "cpu_sample_clock = 'timer'"
        )
    hz = config_hz(proc_root)
    if hz is None:
        return None, (
            "CONFIG_HZ of this kernel is not known (no /proc/config.gz, /boot/config-RELEASE "
            "or readable /proc/timer_list): use cpu_sample_clock = 'timer'"
        )
    return TickInfo(hz, handler, syms[IRQ_ENTRY]), None
