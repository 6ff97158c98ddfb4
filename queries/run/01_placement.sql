-- Placement per run (docs/placement.md): where the run's threads ran, how
-- busy the SMT siblings of those CPUs were meanwhile, NUMA, clock, and what
-- the process was allowed to run on. From the placement probe's rows of the
-- run's pid inside the run (connected_ns .. ended_ns). NULL: not known here
-- (reasons says why); a run the probe never covered has no row.

-- One row per run the placement probe covered.
CREATE OR REPLACE VIEW run_placement AS
WITH r AS (
    SELECT run_id, pid, connected_ns, coalesce(ended_ns, 9223372036854775807) AS until_ns FROM runs
), c AS (       -- per run and CPU
    SELECT r.run_id, p.cpu, sum(p.oncpu_ns) AS oncpu_ns,
           sum(p.sibling_busy_ns) AS sib_ns,
           sum(p.oncpu_ns) FILTER (p.sibling_busy_ns IS NOT NULL) AS sib_base_ns,
           any_value(p.node) AS node,
           sum(p.khz * p.oncpu_ns) FILTER (p.khz IS NOT NULL) AS khz_ns,
           sum(p.oncpu_ns) FILTER (p.khz IS NOT NULL) AS khz_base_ns
    FROM r JOIN placement_cpu p
      ON p.pid = r.pid AND p.end_ns > r.connected_ns AND p.start_ns < r.until_ns
    GROUP BY ALL
), t AS (
    SELECT run_id, sum(oncpu_ns) AS oncpu_ns,
           arg_max(cpu, oncpu_ns) AS main_cpu, max(oncpu_ns) / sum(oncpu_ns) AS main_share,
           arg_max(node, oncpu_ns) AS cpu_node,
           list(cpu ORDER BY cpu) AS cpus,
           list(format('cpu{} {}%', cpu, round(100 * oncpu_ns / run_ns)::INT)
                ORDER BY oncpu_ns DESC, cpu) AS cpu_shares,
           100.0 * sum(sib_ns) / nullif(sum(sib_base_ns), 0) AS sibling_busy_pct,
           sum(khz_ns) / nullif(sum(khz_base_ns), 0) / 1000.0 AS clock_mhz
    FROM (SELECT *, sum(oncpu_ns) OVER (PARTITION BY run_id) AS run_ns FROM c) GROUP BY run_id
), s AS (       -- the run's latest placement row, and how many it had
    SELECT r.run_id, count(*) AS placement_rows,
           arg_max(p.affinity, p.ts_ns) AS affinity, arg_max(p.affinity_cpus, p.ts_ns) AS affinity_cpus,
           arg_max(p.cgroup, p.ts_ns) AS cgroup, arg_max(p.cgroup_cpus, p.ts_ns) AS cgroup_cpus,
           arg_max(p.cgroup_cpuset, p.ts_ns) AS cgroup_cpuset, arg_max(p.hash_seed, p.ts_ns) AS hash_seed,
           arg_max(p.mem_node, p.ts_ns) AS mem_node, arg_max(p.mem_nodes, p.ts_ns) AS mem_nodes,
           arg_max(p.reasons, p.ts_ns) AS reasons
    FROM r JOIN placement p ON p.pid = r.pid AND p.ts_ns < r.until_ns
    GROUP BY r.run_id
)
SELECT
    coalesce(t.run_id, s.run_id) AS run_id,  -- run
    t.oncpu_ns,               -- its threads' on-CPU time the probe saw, ns
    t.main_cpu,               -- the CPU it spent most of that time on
    round(100 * t.main_share, 1) AS main_cpu_pct,  -- that CPU's share of it, %
    t.cpus,                   -- every CPU it ran on
    array_to_string(t.cpu_shares[1:4], ', ') AS cpu_time,  -- the top four CPUs and their shares, 'cpu0 71%, cpu1 29%'
    round(t.sibling_busy_pct, 1) AS sibling_busy_pct,  -- how busy the SMT siblings of its CPUs were while it ran there, % (NULL: no SMT)
    t.cpu_node,               -- the NUMA node of its main CPU (NULL: no node directories)
    s.mem_node,               -- the node holding most of its memory (NULL: one node)
    s.mem_nodes,              -- its pages per node
    s.mem_node IS NOT NULL AND t.cpu_node IS NOT NULL AND s.mem_node <> t.cpu_node AS numa_remote,  -- its memory is on another node than its main CPU
    round(t.clock_mhz)::INTEGER AS clock_mhz,  -- the mean cpufreq clock of its CPUs, weighted by its time there (NULL: no cpufreq)
    s.hash_seed,              -- PYTHONHASHSEED, or 'random'
    s.affinity,               -- the CPUs it may run on (latest)
    s.affinity_cpus,          -- how many
    s.cgroup,                 -- its cgroup v2 path
    s.cgroup_cpus,            -- the cgroup's CPU limit in CPUs (NULL: none)
    s.cgroup_cpuset,          -- the cgroup's effective cpuset
    s.placement_rows,         -- placement rows (1 + changes while traced)
    s.reasons                 -- why fields are NULL
FROM t FULL JOIN s ON s.run_id = t.run_id;
