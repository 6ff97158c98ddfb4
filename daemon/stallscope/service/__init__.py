"""The long-running daemon: probe ingest, the DuckDB store, retention,
configuration and reload, and the systemd glue (readiness, socket activation)."""
