"""The demo's first summary: steps per stage, GC passes, gen-2 overlaps, losses.

Plain SQL over the contract tables, so it works on any database the daemon
wrote, with or without the attribution views.
"""

from stallscope.analysis.formatting import format_rows

# Idle steps (marked idle, or batch 0 on a thread that reports batch sizes:
# the rule of stallscope.vocab.rules and the _step view) are counted
# apart and left out of the percentiles.
STEPS_PER_STAGE = """
WITH s AS (
    SELECT stage, start_ns, end_ns,
           coalesce(idle, false) OR (coalesce(batch, 0) = 0
               AND max(coalesce(batch, 0)) OVER (PARTITION BY run_id, tid) > 0) AS idle
    FROM spans WHERE kind = 'step' {run_filter}
)
SELECT coalesce(stage, '?') AS stage, count(*) FILTER (NOT idle) AS steps,
       count(*) FILTER (idle) AS idle,
       round(median(end_ns - start_ns) FILTER (NOT idle) / 1e6, 2) AS p50_ms,
       round(quantile_cont(end_ns - start_ns, 0.99) FILTER (NOT idle) / 1e6, 2) AS p99_ms,
       round(max(end_ns - start_ns) FILTER (NOT idle) / 1e6, 2) AS max_ms
FROM s GROUP BY ALL ORDER BY min(start_ns)
"""

GC_PER_GENERATION = """
SELECT generation, count(*) AS passes,
       round(max(end_ns - start_ns) / 1e6, 2) AS max_pause_ms,
       round(sum(end_ns - start_ns) / 1e6, 2) AS total_ms,
       sum(collected) AS collected
FROM gc_events WHERE true {run_filter}
GROUP BY generation ORDER BY generation
"""

GEN2_OVERLAPS = """
SELECT g.run_id, round((g.end_ns - g.start_ns) / 1e6, 1) AS pause_ms, g.collected,
       s.stage, s.batch, round((s.end_ns - s.start_ns) / 1e6, 1) AS step_ms
FROM gc_events g JOIN spans s
  ON s.run_id = g.run_id AND s.kind = 'step'
 AND g.start_ns < s.end_ns AND s.start_ns < g.end_ns
WHERE g.generation = 2 {run_filter_g}
ORDER BY g.start_ns
"""

LOSSES = """
SELECT probe, reason, sum(count) AS records, count(*) AS gaps
FROM losses WHERE true {run_filter_loss}
GROUP BY ALL ORDER BY records DESC
"""


def build_summary(con, run_ids=None):
    def flt(col):
        if not run_ids:
            return ""
        return f"AND {col} IN ({', '.join(str(int(r)) for r in run_ids)})"

    parts = []
    for title, sql in (
        ("Engine steps per stage", STEPS_PER_STAGE.format(run_filter=flt("run_id"))),
        ("GC passes per generation", GC_PER_GENERATION.format(run_filter=flt("run_id"))),
        (
            "Steps that overlap a gen-2 collection",
            GEN2_OVERLAPS.format(run_filter_g=flt("g.run_id")),
        ),
        ("Known losses", LOSSES.format(run_filter_loss=flt("run_id"))),
    ):
        cur = con.execute(sql)
        columns = [d[0] for d in cur.description]
        rows = cur.fetchall()
        body = format_rows(columns, rows, "table") if rows else "  (none)\n"
        parts.append(f"{title}\n{body}")
    return "\n".join(parts)
