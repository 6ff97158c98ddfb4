"""Exports to the tools fleets already use: Perfetto traces, Parquet for Spark."""
