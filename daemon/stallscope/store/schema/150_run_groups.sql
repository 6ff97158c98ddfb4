-- Run groups (issue 28, docs/queries.md "Run groups and peers"): the
-- processes of one engine (vLLM's caller, engine core and workers; the
-- ranks of a tensor-parallel job) form a group, so that a step can be
-- joined to the span of another process it waited for (step_peer).
-- Written by ingest/runs.py at HELLO; additive, so an older file gains the
-- columns as NULL (its runs form no group).

-- The run of the traced process's parent: the kernel's ppid of the process
-- (or, when `stallscope run` said which ancestor started it, that ancestor,
-- if the kernel's ppid chain holds it); NULL when no traced run is there.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS parent_run_id BIGINT;
-- The run group: 'u<uid>:<key>' for a key given by the process
-- (STALLSCOPE_GROUP, `stallscope run --group`, `group =` in an attach file):
-- it joins only runs of the same uid; else the parent run's group; else
-- 'run:<run_id>' (a group of its own and its descendants).
ALTER TABLE runs ADD COLUMN IF NOT EXISTS group_key VARCHAR;
-- The rank the process said it is ($STALLSCOPE_RANK, else $RANK as torchrun
-- and ray set it); NULL when none.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS rank INTEGER;
