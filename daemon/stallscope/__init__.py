"""stallscope daemon: ingest, probes, store, queries and API (imports as `stallscope`)."""

__version__ = "0.1.0"
