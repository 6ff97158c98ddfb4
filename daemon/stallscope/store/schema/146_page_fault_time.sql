-- Page-fault time measured in the faulting thread (issue 24). The tracepoint
-- exceptions:page_fault_user has no end event: the page-fault probe measures a
-- fault's time as its thread's on-CPU time from that fault to its next one
-- when that is at most probes.page_fault_gap_us (a burst of first touches is
-- almost all fault time), and prices the faults it could not measure at the
-- mean of the measured ones (docs/kernel-causes.md). Rows written before this
-- file have NULL here: their cost_ns is count x the start-up calibration.
ALTER TABLE page_faults ADD COLUMN IF NOT EXISTS measured INTEGER;     -- faults of the row whose time was measured
ALTER TABLE page_faults ADD COLUMN IF NOT EXISTS measured_ns BIGINT;   -- their summed on-CPU time, ns
-- How cost_ns prices the row's other (count - measured) faults: 'measured'
-- (none left), 'row_mean' (the row's measured faults' mean), 'thread_mean'
-- (the thread's measured faults so far), 'calibrated' (the daemon's start-up
-- cost per first-touch fault: no fault of the thread measured yet), 'none'
-- (no calibration either: cost_ns NULL).
ALTER TABLE page_faults ADD COLUMN IF NOT EXISTS cost_method VARCHAR;

-- The page-fault method a run was measured with: 'oncpu_to_next_fault' (the
-- above) when the page-fault probe covered it; NULL when it did not run, and
-- for runs stored by earlier releases (a calibrated constant per fault).
ALTER TABLE runs ADD COLUMN IF NOT EXISTS page_fault_method VARCHAR;
