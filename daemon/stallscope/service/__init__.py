"""The daemon's wiring: the server (which starts ingest, probes, the store, the
API, metrics and retention and runs the main loop), configuration keys, the
diagnosis windows, exports on request, /metrics, the daemon's own footprint,
the GC followers of client-less processes, and the systemd glue
(`service/systemd/`)."""
