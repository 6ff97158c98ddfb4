-- The probe client's record write, as its HELLO says: which path timed this run's spans.

-- 'c': the optional C write (probe_client/_accel.c); 'python': the standard-library
-- write; NULL: a client that predates the field, or a run with no client (run --no-client).
ALTER TABLE runs ADD COLUMN IF NOT EXISTS probe_accel VARCHAR;
