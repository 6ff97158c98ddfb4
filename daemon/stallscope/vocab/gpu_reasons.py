"""Names for NVML clock-event-reason bits, decoded by value.

NVML reports why the GPU is not at its maximum clock as a bitmask
(`nvmlDeviceGetCurrentClocksEventReasons`); `nvml_samples` keeps the raw
mask and this module, plus the SQL macro in `queries/gpu/clock_event_reasons.sql`,
turns it into names. Bits are decoded by their value, never by the bindings'
constant names, because 0x200 and 0x400 exist only under the old "throttle"
names and constants have been renamed before. It must never import `pynvml`
(reports run where there is no driver).
"""

# value -> (name, slows the clock down below what the work asks for)
CLOCK_EVENT_REASONS = {
    0x1: ("idle", False),  # nothing running: clocks parked
    0x2: ("applications_clocks", False),  # clocks capped by application-clocks setting
    0x4: ("sw_power_cap", True),  # software power cap (power limit)
    0x8: ("hw_slowdown", True),  # hardware slowdown (thermal or power brake asserted)
    0x10: ("sync_boost", True),  # held down to match a sync-boost group
    0x20: ("sw_thermal", True),  # software thermal slowdown
    0x40: ("hw_thermal", True),  # hardware thermal slowdown
    0x80: ("power_brake", True),  # external power-brake signal
    0x100: ("display_clock", False),  # display clock setting
    0x200: ("board_limit", True),  # board limit (old name only)
    0x400: ("reliability", True),  # reliability limit (old name only)
}

# Bits that mean "the clock is being held below demand" (everything but
# idle, applications clocks and display clock): 0x6FC.
SLOWDOWN_MASK = sum(bit for bit, (_, slows) in CLOCK_EVENT_REASONS.items() if slows)


def decode_clock_event_reasons(mask):
    """Names of the bits set in `mask`, lowest bit first; None for None.

    Unknown bits come back as 'unknown_0x...' so that nothing is hidden."""
    if mask is None:
        return None
    mask = int(mask)
    names = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            known = CLOCK_EVENT_REASONS.get(bit)
            names.append(known[0] if known else f"unknown_{bit:#x}")
        bit <<= 1
    return names


def is_slowdown(mask):
    """True when any bit says the clock is held below demand; None for None."""
    if mask is None:
        return None
    return bool(int(mask) & SLOWDOWN_MASK)
