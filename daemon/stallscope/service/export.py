"""The daemon's own Parquet exports: on request (the API's ExportParquet) and
after each retention check.

DuckDB lets only the daemon open its file while it runs, and the API's
Query sandbox has no file access (store.SANDBOX_CONFIG), so a fleet export
of a live database is done here, by the daemon, into the one directory its
configuration names (export.parquet_dir): a client can ask for an export
but never choose where the daemon writes. The export reads a snapshot
through a cursor (export/parquet.py) and takes the store's writer lock only
while the snapshot opens; it never blocks ingest for longer. One export at
a time.
"""

import logging
import os
import socket
import threading

from stallscope.errors import ExportBusy
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))


class DaemonExports:
    def __init__(self, store, out_dir, host=None):
        self.store = store
        self.out_dir = os.path.abspath(out_dir) if out_dir else None
        self.host = host or socket.gethostname()
        self._lock = threading.Lock()
        self.exports = 0
        self.last = None  # the last ExportResult

    def export(self):
        """One export now; returns its ExportResult. RuntimeError when no
        directory is configured, ExportBusy when one runs already."""
        from stallscope.export.parquet import export_parquet

        if not self.out_dir:
            raise RuntimeError(
                "the daemon has no export directory: start it with --export-dir DIR "
                "(config export.parquet_dir)"
            )
        if not self._lock.acquire(blocking=False):
            raise ExportBusy(f"an export to {self.out_dir} is running")
        try:
            cur = self.store.cursor()
            try:
                result = export_parquet(
                    cur, self.out_dir, self.host, snapshot_lock=self.store.exclusive(), live=True
                )
            finally:
                cur.close()
            self.exports += 1
            self.last = result
            log.info("%s", result.summary())
            return result
        finally:
            self._lock.release()

    def after_retention(self):
        """The retention thread's hook: export, and say why not if it fails."""
        try:
            self.export()
        except ExportBusy:
            pass
        except Exception as exc:  # an export must never take the daemon down
            log.warning("export after retention failed: %s", exc)
