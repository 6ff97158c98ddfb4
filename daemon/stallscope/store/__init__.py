"""The one DuckDB file and everything that writes or listens to it: the writer
thread (`database`), the schema and its migrations (`schema/`, `migrations`),
the named views' loader (`views`), disk-full recovery, retention, coverage
rows, the per-step attribution fill, and the store listeners that fan batches
out to live subscribers (`fanout`) and turn them into stall alerts
(`alerts`)."""
