-- Placement (issue 27, docs/placement.md): where each traced process ran and
-- what shared its CPUs, written by probes/placement_proc.py from /proc and
-- /sys. pid is the process; times CLOCK_MONOTONIC ns (the daemon's clock,
-- as runs.connected_ns). The view run_placement sums them per run.

-- One row per traced process at tracking start and whenever one of its
-- fields changes. NULL: not known here, and `reasons` says why.
CREATE TABLE IF NOT EXISTS placement (
    pid           INTEGER,
    ts_ns         BIGINT,     -- when it was read
    affinity      VARCHAR,    -- the CPUs it may run on (Cpus_allowed_list), e.g. '0-7'
    affinity_cpus INTEGER,    -- how many
    cgroup        VARCHAR,    -- its cgroup v2 path
    cgroup_cpus   DOUBLE,     -- the cgroup's CPU limit in CPUs (cpu.max quota / period); NULL: none or not readable
    cgroup_cpuset VARCHAR,    -- the cgroup's cpuset.cpus.effective; NULL: not readable
    hash_seed     VARCHAR,    -- PYTHONHASHSEED as the process was started with it, or 'random'
    mem_node      INTEGER,    -- the NUMA node holding most of its resident pages (numa_maps); NULL on one node
    mem_nodes     VARCHAR,    -- its pages per node, 'N0=123,N1=4'
    reasons       VARCHAR,    -- why fields are NULL (no SMT, one NUMA node, no cpufreq, environ unreadable, ...)
    stored_ns     BIGINT DEFAULT getvariable('stallscope_stored_ns')
);

-- Per traced process, CPU and window (placement_window_s): the on-CPU time
-- of its threads there (each thread's CPU time of a poll interval given to
-- the CPU it was on at the interval's end) and how busy that CPU's SMT
-- siblings were meanwhile.
CREATE TABLE IF NOT EXISTS placement_cpu (
    pid             INTEGER,
    cpu             SMALLINT,
    start_ns        BIGINT,
    end_ns          BIGINT,
    oncpu_ns        BIGINT,   -- its threads' on-CPU time on this CPU in the window, ns
    sibling_busy_ns BIGINT,   -- that time weighted by its busiest SMT sibling's busy share per poll interval, ns; NULL without a sibling
    node            SMALLINT, -- the CPU's NUMA node; NULL without node directories
    khz             INTEGER,  -- the CPU's mean cpufreq clock over the window; NULL without cpufreq
    stored_ns       BIGINT DEFAULT getvariable('stallscope_stored_ns')
);
