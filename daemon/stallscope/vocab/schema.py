"""Constants of the store's schema that writers outside the store share.

Every row a flush writes (or changes) carries this flush's `stored_ns`
(store/schema/080_export.sql): the column's default reads the session
variable `STORED_NS_VARIABLE`, which the store's flush sets on its cursor;
an UPDATE written elsewhere (ingest's run progress, coverage rows) sets it
again with `STORED_NS_SQL`.
"""

STORED_NS_VARIABLE = "stallscope_stored_ns"
STORED_NS_SQL = f"getvariable('{STORED_NS_VARIABLE}')"
