"""Constants of the store's schema that writers outside the store share.

Every row a flush writes (or changes) carries this flush's `stored_ns`
(store/schema/080_export.sql): the column's default reads the session
variable `STORED_NS_VARIABLE`, which the store's flush sets on its cursor;
an UPDATE written elsewhere (ingest's run progress, coverage rows) sets it
again with `STORED_NS_SQL`.
"""

STORED_NS_VARIABLE = "stallscope_stored_ns"
STORED_NS_SQL = f"getvariable('{STORED_NS_VARIABLE}')"

# The CPU sampler's frame and stack ids (probes/cpu_stacks.py) are handed out
# afresh every epoch, so a sample names only ids of its own epoch or the one
# before; retention (store/retention.py) deletes a cpu_frames / cpu_stacks row
# only when no sample uses it and it is older than two epochs.
CPU_STACK_EPOCH_NS = 600 * 10**9

# The version of step_components' columns (store/step_fill.py): the number of
# the schema file that last added columns the filler writes. Stored rows of
# an older version lack those columns: the filler fills their steps again
# and the views (queries/step/01_steps.sql, _step_frontier, which repeats the
# number; tests/store check the two agree) read only rows of this version.
STEP_FILL_VERSION = 145
