"""Which probe covered which run when: the `coverage` table.

A row (run_id, probe, start_ns, end_ns) opens when a run starts while the
probe covers its process (loaded, the process in its filter, and for a
detachable probe attached), or when the probe starts covering while the run
is live; it closes (end_ns set) when the run ends, the probe stops covering
(a diagnosis window ends) or the daemon stops. end_ns NULL means still
covering. Views read a step outside every row of a probe as "not looked
at" (NULL), not "nothing happened" (0). Writes go through the store's
statement queue, in order; this module never reads the database.
"""

import threading
import time

from stallscope.vocab.schema import STORED_NS_SQL


class Coverage:
    def __init__(self, store):
        self.store = store
        # probe -> samples per second of its rows (the CPU sampler's
        # cpu_sample_hz: the views turn samples into time with it)
        self.sample_hz = {}
        self._open = {}  # (run_id, probe) -> start_ns
        self._runs = {}  # run_id -> pid of live runs
        self._lock = threading.Lock()

    def run_started(self, run_id, pid, probes, now_ns=None):
        """Run `run_id` of process `pid` is live; `probes`: names covering it now."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        with self._lock:
            self._runs[run_id] = pid
            for probe in probes:
                self._open_row(run_id, probe, now_ns)

    def run_ended(self, run_id, now_ns=None):
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        with self._lock:
            self._runs.pop(run_id, None)
            for key in [k for k in self._open if k[0] == run_id]:
                self._close_row(key, now_ns)

    def probe_started(self, probe, now_ns=None):
        """`probe` covers every live run from now (e.g. a diagnosis window opens)."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        with self._lock:
            for run_id in self._runs:
                self._open_row(run_id, probe, now_ns)

    def probe_stopped(self, probe, now_ns=None):
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        with self._lock:
            for key in [k for k in self._open if k[1] == probe]:
                self._close_row(key, now_ns)

    def close_all(self, now_ns=None):
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        with self._lock:
            for key in list(self._open):
                self._close_row(key, now_ns)

    def live_runs(self):
        with self._lock:
            return dict(self._runs)

    def open_rows(self):
        with self._lock:
            return dict(self._open)

    def _open_row(self, run_id, probe, now_ns):
        if (run_id, probe) in self._open:
            return
        self._open[(run_id, probe)] = now_ns
        self.store.sql(
            "INSERT INTO coverage (run_id, probe, start_ns, end_ns, sample_hz) "
            "VALUES (?, ?, ?, NULL, ?)",
            [int(run_id), probe, int(now_ns), self.sample_hz.get(probe)],
        )

    def _close_row(self, key, now_ns):
        start_ns = self._open.pop(key)
        self.store.sql(
            f"UPDATE coverage SET end_ns = ?, stored_ns = {STORED_NS_SQL} WHERE run_id = ? AND probe = ? AND start_ns = ? "
            "AND end_ns IS NULL",
            [int(now_ns), int(key[0]), key[1], int(start_ns)],
        )
