"""A log channel with a per-second budget.

A flood of short client sessions would otherwise cost a log line each (and
the journal's rate limit would then hide the daemon's other messages). Lines
over the budget are counted and summarised once the next second starts; the
count is the only thing lost.
"""

import time


class RateLimitedLog:
    """`info()` at most `per_s` times a second on `logger`, the rest counted."""

    def __init__(self, logger, per_s, what="messages"):
        self.logger, self.per_s, self.what = logger, per_s, what
        self._t0, self._n, self._skipped = 0.0, 0, 0

    def info(self, fmt, *args):
        now = time.monotonic()
        if now - self._t0 >= 1.0:
            if self._skipped:
                self.logger.info("%d %s not logged in the last second", self._skipped, self.what)
            self._t0, self._n, self._skipped = now, 0, 0
        if self._n < self.per_s:
            self._n += 1
            self.logger.info(fmt, *args)
        else:
            self._skipped += 1
