"""Waiting for a condition instead of sleeping a fixed time (the machine is
shared and noisy: no test asserts how long something took)."""

import time


def wait_for(pred, timeout_s=15.0, interval_s=0.02):
    """Poll `pred` until it returns something truthy (returned) or time runs out (None)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(interval_s)
    return None
