-- Schema version 1: the first release with a recorded schema version.
-- Nothing to transform: the additive files (../NNN_*.sql) already added this
-- release's tables and columns to a file written by the first release
-- (offcpu.preemptor_*/waker_*, syscalls, page_faults, irq_time, steal,
-- coverage, spans.work/idle). Later migrations that change data go here as
-- 002_*.sql, 003_*.sql, ...
SELECT 1;
