-- Per-step CPU profiles: what code each step ran on CPU, against what the
-- baseline steps of its kind run (the CPU sampler's rows: cpu_samples,
-- cpu_stacks, cpu_frames; docs/cpu-sampler.md). step_attribution names the
-- causes `code` and `cpu_slow` from these (the rules are in its file and in
-- docs/queries.md); step_profile shows every step's frames.
--
-- A step's samples: cpu_samples rows of its thread whose timer fired inside
-- it. Only user-mode samples whose Python frames were all walked make the
-- profile (kernel-mode samples are system calls, faults and interrupts: they
-- never count as code; a sample with lost frames would read as a new code
-- path); the others are counted apart.
--
-- Frames: the call tree of the samples' stacks. A node is a path of
-- functions from the outermost frame down: a Python function (file,
-- qualname; its lines merge), then a sample's native leaf as two nodes, its
-- module and, when the module names one, its symbol. A native leaf inside
-- the interpreter itself (python3.X, libpython3.X) is the Python frame's own
-- execution: no node of its own. The same function on two call paths is two
-- nodes; recursion makes a node per level.

-- Per step: its samples by kind and by stack, and who held its thread's CPU
-- just before and during it: the task that ran there right before each
-- switch-in of the thread inside the step or at most 10 ms before its start
-- (offcpu.prev_*; the idle task and the step's own process left out), its
-- run time counted up to 10 ms per switch-in. Scoped (see _step_todo): of
-- the unfilled steps only, which is what the daemon's filler stores.
CREATE OR REPLACE MACRO _step_cpu_of(scoped) AS TABLE
WITH steps AS (
    SELECT run_id, pid, tid, step_idx, start_ns, end_ns FROM _step WHERE NOT scoped
    UNION ALL SELECT run_id, pid, tid, step_idx, start_ns, end_ns FROM _step_todo WHERE scoped
), bucket AS (
    SELECT * FROM _step_bucket WHERE NOT scoped UNION ALL SELECT * FROM _step_todo_bucket WHERE scoped
), cover AS (
    SELECT * FROM _step_cover WHERE NOT scoped UNION ALL SELECT * FROM _step_todo_cover WHERE scoped
), bound AS (
    SELECT coalesce(max(first_ns), -9223372036854775807) AS first_ns FROM _step_todo_bound WHERE scoped
), hit AS (
    SELECT c.run_id, c.tid, c.step_idx, s.ts_ns, s.stack_id,
           coalesce(s.kernel_mode, false) AS kernel_mode,
           s.unwind IS NULL AND s.stack_id IS NOT NULL AS walked
    FROM cpu_samples s
    CROSS JOIN bucket b
    JOIN cover c
      ON c.pid = s.pid AND c.tid = s.tid AND c.bucket = s.ts_ns // b.bucket_ns
     AND s.ts_ns >= c.start_ns AND s.ts_ns < c.end_ns
    WHERE s.ts_ns >= (SELECT first_ns FROM bound)
), per AS (
    SELECT run_id, tid, step_idx,
        count(*) FILTER (NOT kernel_mode AND walked) AS cpu_samples,
        count(*) FILTER (kernel_mode) AS cpu_kernel_samples,
        count(*) FILTER (NOT kernel_mode AND NOT walked) AS cpu_partial_samples
    FROM hit GROUP BY ALL
), prof AS (
    SELECT h.run_id, h.tid, h.step_idx, h.stack_id, count(*)::INTEGER AS n,
           count(*) FILTER (h.ts_ns >= u.submit_start_ns AND h.ts_ns < u.submit_end_ns)::INTEGER AS n_submit
    FROM hit h
    LEFT JOIN _step_submit_call_of(scoped) u USING (run_id, tid, step_idx)
    WHERE NOT h.kernel_mode AND h.walked
    GROUP BY ALL
), lists AS (
    SELECT run_id, tid, step_idx,
           list({'stack_id': stack_id, 'n': n, 'n_submit': n_submit} ORDER BY stack_id) AS cpu_stack_counts
    FROM prof GROUP BY ALL
), sw AS (     -- switch-ins of step threads after another process held the CPU
    SELECT o.pid, o.tid, o.end_ns AS at_ns, o.prev_pid, o.prev_comm,
           least(o.prev_run_ns, 10000000) AS run_ns
    FROM offcpu o
    WHERE o.prev_run_ns > 0 AND o.prev_pid <> 0 AND o.prev_pid <> o.pid
      AND o.resolution_ns IS NULL AND o.end_ns >= (SELECT first_ns FROM bound) - 10000000
      AND o.end_ns <= coalesce(getvariable('_step_fill_until_ns'), 9223372036854775807)
), swh AS (    -- each to the step it falls in, else the step that starts within 10 ms after it
    SELECT s.run_id, s.tid, s.step_idx, w.prev_pid, w.prev_comm, w.run_ns, w.at_ns
    FROM sw w ASOF JOIN steps s ON s.pid = w.pid AND s.tid = w.tid AND w.at_ns < s.end_ns
    WHERE w.at_ns >= s.start_ns - 10000000
), oth AS (    -- (scoped: not a switch-in inside a filled step: that one is the filled step's)
    SELECT h.run_id, h.tid, h.step_idx, sum(h.run_ns)::BIGINT AS other_task_ns,
           arg_max({'pid': h.prev_pid, 'comm': h.prev_comm, 'run_ns': h.run_ns}, (h.run_ns, h.prev_comm)) AS other_task
    FROM swh h
    LEFT JOIN _step_frontier f ON scoped AND f.run_id = h.run_id AND f.tid = h.tid
    WHERE f.run_id IS NULL OR h.at_ns >= f.todo_from_ns
    GROUP BY ALL
), k AS (
    SELECT run_id, tid, step_idx FROM per UNION SELECT run_id, tid, step_idx FROM oth
)
SELECT k.run_id, k.tid, k.step_idx,
       per.cpu_samples, per.cpu_kernel_samples, per.cpu_partial_samples,
       lists.cpu_stack_counts, oth.other_task_ns, oth.other_task
FROM k
LEFT JOIN per USING (run_id, tid, step_idx)
LEFT JOIN lists USING (run_id, tid, step_idx)
LEFT JOIN oth USING (run_id, tid, step_idx);

-- Every step's CPU columns: the filled steps' from step_components, the
-- others computed now (one row per step with a sample or a switch-in).
CREATE OR REPLACE VIEW _step_cpu AS
SELECT m.run_id, m.tid, m.step_idx, m.cpu_samples, m.cpu_kernel_samples, m.cpu_partial_samples,
       m.cpu_stack_counts, m.other_task_ns, m.other_task
FROM step_components m JOIN _step_frontier f USING (run_id, tid)
WHERE m.step_idx <= f.filled_idx AND (m.cpu_samples IS NOT NULL OR m.other_task_ns IS NOT NULL)
UNION ALL BY NAME
SELECT * FROM _step_cpu_of(true);

-- The nodes of every stack, outermost first. level: 0 = the outermost
-- frame; node: a 64-bit key of the path from it (the sum of a hash of each
-- (level, function) on the path); py_frame_id: the innermost Python frame
-- at or above the node (what calls a native node); parent: the node one
-- level up (NULL at level 0).
CREATE OR REPLACE VIEW _cpu_stack_node AS
WITH f AS (
    SELECT st.stack_id, st.depth, st.frame_id, fr.kind, fr.file, fr.function,
           fr.kind = 'native' AND regexp_matches(coalesce(fr.file, ''), '(^|/)(lib)?python[0-9][^/]*$') AS interp
    FROM cpu_stacks st JOIN cpu_frames fr USING (frame_id)
), e AS (
    SELECT stack_id, depth, 0 AS sub, frame_id, 'py' AS node_kind, file, function FROM f WHERE kind = 'py'
    UNION ALL
    SELECT stack_id, depth, 0, frame_id, 'module', file, NULL FROM f WHERE kind = 'native' AND NOT interp
    UNION ALL
    SELECT stack_id, depth, 1, frame_id, 'native', file, function FROM f
    WHERE kind = 'native' AND NOT interp AND function IS NOT NULL
), o AS (
    SELECT e.*, row_number() OVER (PARTITION BY stack_id ORDER BY depth DESC, sub) - 1 AS level
    FROM e
), k AS (
    SELECT stack_id, level, frame_id, node_kind,
        (sum(hash(level, node_kind, file, function))
            OVER (PARTITION BY stack_id ORDER BY level ROWS UNBOUNDED PRECEDING) % 18446744073709551616)::UBIGINT AS node,
        last_value(CASE WHEN node_kind = 'py' THEN frame_id END IGNORE NULLS)
            OVER (PARTITION BY stack_id ORDER BY level ROWS UNBOUNDED PRECEDING) AS py_frame_id
    FROM o
)
SELECT k.*, lag(node) OVER (PARTITION BY stack_id ORDER BY level) AS parent FROM k;

-- Per step and node of its profile: the samples through it, and the frame
-- (the line) and calling Python frame with the most of them (ties: the
-- lower frame id).
CREATE OR REPLACE VIEW _step_cpu_node AS
WITH h AS (
    SELECT run_id, tid, step_idx, unnest(cpu_stack_counts, recursive := true)
    FROM _step_cpu WHERE cpu_stack_counts IS NOT NULL
), byframe AS (
    SELECT h.run_id, h.tid, h.step_idx, n.node, n.frame_id, n.py_frame_id,
           min(n.level) AS level, any_value(n.node_kind) AS node_kind, any_value(n.parent) AS parent,
           sum(h.n) AS n, sum(h.n_submit) AS n_submit
    FROM h JOIN _cpu_stack_node n ON n.stack_id = h.stack_id
    GROUP BY ALL
)
SELECT run_id, tid, step_idx, node, min(level) AS level, any_value(node_kind) AS node_kind,
       any_value(parent) AS parent, arg_max(frame_id, (n, -frame_id)) AS frame_id, arg_max(py_frame_id, (n, -frame_id)) AS py_frame_id,
       sum(n)::BIGINT AS samples, sum(n_submit)::BIGINT AS samples_in_submit
FROM byframe
GROUP BY run_id, tid, step_idx, node;

-- The sampling period of each run's CPU samples, ns (1e9 / cpu_sample_hz of
-- its coverage rows; 1 ms for rows written without a rate).
CREATE OR REPLACE VIEW _cpu_period AS
SELECT run_id, round(1e9 / coalesce(max(sample_hz), 1000))::BIGINT AS period_ns
FROM coverage WHERE probe = 'cpu' GROUP BY run_id;

-- A frame's name: a Python function as `qualname (file:line)`, a native
-- module as `module`, a symbol as `module:symbol`; a native node adds the
-- Python function that called it (`... <- qualname (file:line)`). The
-- arguments are the node's kind and its cpu_frames row's and its Python
-- frame's (py_frame_id) function, file and line.
CREATE OR REPLACE MACRO _cpu_node_label(node_kind, fn, fl, ln, py_fn, py_fl, py_ln) AS
    CASE node_kind
        WHEN 'py' THEN coalesce(fn, '?') || ' (' || coalesce(fl, '?') || coalesce(':' || ln, '') || ')'
        ELSE coalesce(regexp_extract(fl, '[^/]*$'), '?')
             || CASE WHEN node_kind = 'native' THEN ':' || coalesce(fn, '?') ELSE '' END
             || coalesce(' <- ' || py_fn || ' (' || coalesce(py_fl, '?') || coalesce(':' || py_ln, '') || ')', '')
    END;

-- The standard normal distribution function (Abramowitz and Stegun 26.2.17,
-- absolute error < 7.5e-8).
CREATE OR REPLACE MACRO _phi_tail(z) AS   -- 1 - Phi(|z|)
    exp(-z * z / 2) / sqrt(2 * pi()) * (1.0 / (1.0 + 0.2316419 * abs(z)))
    * (0.319381530 + (1.0 / (1.0 + 0.2316419 * abs(z)))
       * (-0.356563782 + (1.0 / (1.0 + 0.2316419 * abs(z)))
          * (1.781477937 + (1.0 / (1.0 + 0.2316419 * abs(z)))
             * (-1.821255978 + (1.0 / (1.0 + 0.2316419 * abs(z))) * 1.330274429))));
CREATE OR REPLACE MACRO _phi(z) AS CASE WHEN z >= 0 THEN 1 - _phi_tail(z) ELSE _phi_tail(z) END;

-- One-sided test of a node's samples against its baseline share: is `n` of
-- a step's `total` profile samples more than a node holding `share` of the
-- baseline steps' samples gives, at level _phi_tail(z)? The exact binomial
-- tail P(X >= n), X ~ Binomial(total, share), where the variance is small
-- (a Poisson tail there overstates it: 16 of 22 samples in a frame of
-- share 0.24 is p = 2e-6, not 1.5e-4; its first 2,000 terms: the rest are
-- negligible), the normal approximation (continuity-corrected) where the
-- variance is at least 10.
CREATE OR REPLACE MACRO _cpu_excess_significant(n, total, share, z) AS
    CASE
        WHEN n IS NULL OR total IS NULL OR total <= 0 OR share IS NULL OR share <= 0 OR share >= 1 THEN false
        WHEN n > total THEN false
        WHEN total * share * (1 - share) >= 10 THEN
            n - 0.5 - total * share >= z * sqrt(total * share * (1 - share))
        ELSE list_sum([exp(lgamma(total + 1) - lgamma(j + 1) - lgamma(total - j + 1)
                           + j * ln(share) + (total - j) * ln(1 - share))
                       FOR j IN range(n::BIGINT, least(total, n + 2000)::BIGINT + 1)]) <= _phi_tail(z)
    END;

-- The power of that test against a localized excess of `x` samples in a
-- node holding `share` of a normal step (normal approximation): the chance
-- that `total` samples, x of them the excess, would have been found
-- significant is _phi(_cpu_power_z(total, _cpu_power_p1(total, x, share),
-- share, z)) (two steps, so that callers compute p1 once: pass columns).
-- p1 is the node's share of such a step's samples.
CREATE OR REPLACE MACRO _cpu_power_p1(total, x, share) AS
    CASE WHEN total > 0 AND x > 0 THEN (share * (total - least(x, total)) + least(x, total)) / total END;
CREATE OR REPLACE MACRO _cpu_power_z(total, p1, share, z) AS
    (total * p1 - (total * share + z * sqrt(total * share * (1 - share)) + 0.5))
    / sqrt(greatest(total * p1 * (1 - p1), 1e-9));

-- One row per step and node of its CPU profile (steps the CPU sampler
-- covered). samples: the step's samples through the node; expected_samples:
-- what a normal step of its baseline group (step_attribution.baseline_group:
-- run, stage, batch or work bucket; its non-idle, non-slow steps) spends
-- there per ns, times the step's baseline_ns (NULL when the group has fewer
-- than baseline_min_steps normal steps); excess_ns: the difference in time.
-- The root holds the step's whole on-CPU excess. share and localized_ns are
-- what the `code` cause reads: the node's share of the group's samples, and
-- the samples beyond that share of the step's own samples.
CREATE OR REPLACE VIEW step_profile AS
WITH a AS MATERIALIZED (
    SELECT run_id, tid, step_idx, baseline_group, slow, idle, baseline_ns, duration_ns,
           cpu_samples, cpu_sample_period_ns AS period_ns
    FROM step_attribution WHERE cpu_samples IS NOT NULL
), g AS (
    SELECT run_id, baseline_group, count(*) AS steps, sum(cpu_samples) AS s_n, sum(duration_ns) AS s_dur
    FROM a WHERE NOT slow AND NOT idle AND baseline_ns > 0 GROUP BY ALL
), gn AS (
    SELECT a.run_id, a.baseline_group, n.node, sum(n.samples) AS s_node
    FROM a JOIN _step_cpu_node n USING (run_id, tid, step_idx)
    WHERE NOT a.slow AND NOT a.idle AND a.baseline_ns > 0 GROUP BY ALL
), x AS (
    SELECT n.*, a.cpu_samples, a.period_ns, a.baseline_ns,
           g.steps >= p.baseline_min_steps AS usable, p.code_z,
           coalesce(gn.s_node, 0) / g.s_dur * a.baseline_ns AS expected,
           (coalesce(gn.s_node, 0) + 0.5) / (g.s_n + 1) AS share
    FROM _step_cpu_node n
    JOIN a USING (run_id, tid, step_idx)
    CROSS JOIN step_params p
    LEFT JOIN g ON g.run_id = a.run_id AND g.baseline_group = a.baseline_group
    LEFT JOIN gn ON gn.run_id = a.run_id AND gn.baseline_group = a.baseline_group AND gn.node = n.node
)
SELECT
    x.run_id,             -- run
    x.tid,                -- step's thread
    x.step_idx,           -- step index on the thread
    x.frame_id,           -- the node's cpu_frames row (the line most sampled there)
    x.samples,            -- the step's profile samples through the node
    CASE WHEN usable AND baseline_ns IS NOT NULL THEN round(expected, 3) END AS expected_samples,  -- what a normal step of its group spends there, scaled to the step's baseline_ns
    CASE WHEN usable AND baseline_ns IS NOT NULL THEN round((samples - expected) * period_ns)::BIGINT END AS excess_ns,  -- (samples - expected_samples) x the sampling period, ns
    x.node,               -- the node: a key of its path of functions from the outermost frame
    x.level,              -- its depth on that path (0 = the outermost frame)
    x.node_kind,          -- 'py' (a Python function), 'module' (a native module), 'native' (a native symbol)
    _cpu_node_label(x.node_kind, f1.function, f1.file, f1.line, f2.function, f2.file, f2.line) AS frame,  -- its name (as step_attribution.code_frame)
    CASE WHEN usable THEN round(share, 6) END AS share,  -- its share of the group's normal samples (+0.5 sample), 0..1
    CASE WHEN usable THEN round((samples - cpu_samples * share) * period_ns)::BIGINT END AS localized_ns,  -- samples beyond that share of the step's own samples, x the period, ns
    CASE WHEN NOT usable THEN NULL WHEN samples - cpu_samples * share >= 1
        THEN _cpu_excess_significant(samples, cpu_samples, share, code_z) ELSE false END AS significant,  -- the localized excess passes the test at step_code_z
    x.samples_in_submit   -- of the samples, those inside the step's submit calls
FROM x
LEFT JOIN (SELECT frame_id AS f1_id, function, file, line FROM cpu_frames) f1 ON f1.f1_id = x.frame_id
LEFT JOIN (SELECT frame_id AS f2_id, function, file, line FROM cpu_frames) f2 ON f2.f2_id = x.py_frame_id;


-- The differential profile of each baseline group (step_attribution.
-- baseline_group: a busy bucket): per node, the samples of its slow steps
-- against those of its normal steps (non-idle, not slow), for the frames
-- whose share grows in slow steps. excess_ns: the slow steps' samples there
-- beyond the normal share of their samples, x the sampling period; z: the
-- two-proportion z-score of the growth (its confidence: 3.1 is one-sided
-- level 0.001). The report's top-frames table and differential flame graph
-- read it.
CREATE OR REPLACE VIEW step_profile_diff AS
WITH a AS MATERIALIZED (
    SELECT run_id, tid, step_idx, baseline_group, slow, cpu_samples, cpu_sample_period_ns AS period_ns
    FROM step_attribution
    WHERE cpu_samples IS NOT NULL AND NOT idle AND baseline_ns > 0
), tot AS (
    SELECT run_id, baseline_group, any_value(period_ns) AS period_ns,
           count(*) FILTER (slow) AS slow_steps, count(*) FILTER (NOT slow) AS normal_steps,
           coalesce(sum(cpu_samples) FILTER (slow), 0) AS slow_total,
           coalesce(sum(cpu_samples) FILTER (NOT slow), 0) AS normal_total
    FROM a GROUP BY ALL
), n AS (
    SELECT a.run_id, a.baseline_group, c.node, min(c.level) AS level, any_value(c.parent) AS parent,
           any_value(c.node_kind) AS node_kind,
           -- the line of the step with the most samples there; ties: the lower
           -- frame id (without it, which of two tied lines a report printed
           -- changed from one query to the next)
           arg_max(c.frame_id, (c.samples, -c.frame_id)) AS frame_id,
           arg_max(c.py_frame_id, (c.samples, -c.frame_id)) AS py_frame_id,
           coalesce(sum(c.samples) FILTER (a.slow), 0) AS slow_samples,
           coalesce(sum(c.samples) FILTER (NOT a.slow), 0) AS normal_samples
    FROM a JOIN _step_cpu_node c USING (run_id, tid, step_idx)
    GROUP BY ALL
), x AS (
    SELECT n.*, t.slow_steps, t.normal_steps, t.slow_total, t.normal_total, t.period_ns,
           n.slow_samples / nullif(t.slow_total, 0) AS slow_share,
           n.normal_samples / nullif(t.normal_total, 0) AS normal_share,
           (n.slow_samples + n.normal_samples) / nullif(t.slow_total + t.normal_total, 0) AS pooled
    FROM n JOIN tot t USING (run_id, baseline_group)
)
SELECT
    run_id,               -- run
    baseline_group,       -- the group (step_attribution.baseline_group)
    slow_steps,           -- its slow steps the CPU sampler covered
    normal_steps,         -- its normal steps the CPU sampler covered
    node,                 -- the node (as step_profile.node)
    parent,               -- the node one level up (NULL at level 0)
    level,                -- its depth (0 = the outermost frame)
    _cpu_node_label(x.node_kind, f1.function, f1.file, f1.line, f2.function, f2.file, f2.line) AS frame,  -- its name
    slow_samples,         -- the slow steps' samples through it
    normal_samples,       -- the normal steps' samples through it
    round(slow_share, 6) AS slow_share,      -- its share of the slow steps' samples, 0..1
    round(normal_share, 6) AS normal_share,  -- its share of the normal steps' samples, 0..1
    round((slow_samples - slow_total * coalesce(normal_share, 0)) * period_ns)::BIGINT AS excess_ns,  -- the slow steps' samples beyond the normal share, x the period, ns
    round(CASE WHEN pooled > 0 AND pooled < 1 AND slow_total > 0 AND normal_total > 0 THEN
        (slow_share - normal_share) / sqrt(pooled * (1 - pooled) * (1.0 / slow_total + 1.0 / normal_total))
    END, 3) AS z        -- two-proportion z-score of the growth (NULL without both kinds of step)
FROM x
LEFT JOIN (SELECT frame_id AS f1_id, function, file, line FROM cpu_frames) f1 ON f1.f1_id = x.frame_id
LEFT JOIN (SELECT frame_id AS f2_id, function, file, line FROM cpu_frames) f2 ON f2.f2_id = x.py_frame_id;
