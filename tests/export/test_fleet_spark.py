"""Apache Spark and DuckDB give the same fleet answer over two hosts' exports.

Two real traced runs on two daemons (distinct host names) are exported with
`stallscope export parquet` into one directory. Spark (pyspark, local mode)
reads the Hive-partitioned dataset as any Spark job would and asks the seed
report's fleet questions: gen-2 GC stalls per host, and the share of slow
steps by cause per host. DuckDB answers them through the fleet views, which
run queries/ over each host's exported raw tables. Both must equal each
other and what each host's own database says. `make fleet` runs this file;
CI too (STALLSCOPE_REQUIRE_FLEET=1: a skip is a failure).
"""

import os
import subprocess
import sys

import pytest

from export.conftest import HOSTS
from helpers.fleet import require_spark
from stallscope.export.fleet import open_fleet

pytestmark = pytest.mark.daemon

SPARK_GEN2 = """
SELECT host, count(*) AS gen2_passes,
       sum(CASE WHEN stall THEN 1 ELSE 0 END) AS gen2_stalls
FROM seed_gen2 GROUP BY host
"""
SPARK_CAUSES = """
WITH h AS (
    SELECT host, sum(CASE WHEN NOT idle THEN 1 ELSE 0 END) AS steps,
           sum(CASE WHEN slow THEN 1 ELSE 0 END) AS slow_steps
    FROM step_attribution GROUP BY host
)
SELECT a.host, a.cause, count(*) AS slow_steps,
       round(count(*) / max(h.slow_steps), 6) AS share_of_slow,
       round(count(*) / max(h.steps), 6) AS share_of_steps
FROM step_attribution a JOIN h ON a.host = h.host
WHERE a.slow GROUP BY a.host, a.cause
"""
SPARK_RAW_GEN2 = """
SELECT host, count(*) AS passes FROM gc_events WHERE generation = 2 GROUP BY host
"""

# Spark runs in its own process: a JVM per test session, with its memory and
# threads kept small for a shared 2-core machine.
SPARK_SCRIPT = r"""
import json, sys
from pyspark.sql import SparkSession
out_dir, queries = sys.argv[1], json.loads(sys.argv[2])
spark = (SparkSession.builder.master("local[2]").appName("stallscope-fleet-test")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .config("spark.driver.memory", "768m").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
for table in ("seed_gen2", "step_attribution", "gc_events"):
    (spark.read.option("mergeSchema", "true").parquet(f"{out_dir}/table={table}")
     .createOrReplaceTempView(table))
answers = {name: [r.asDict() for r in spark.sql(sql).collect()] for name, sql in queries.items()}
types = {f.name: f.dataType.simpleString() for f in spark.table("step_attribution").schema.fields}
print("ANSWERS " + json.dumps({"answers": answers, "types": types}, default=str))
spark.stop()
"""


def run_spark(out_dir):
    import json

    queries = {"gen2": SPARK_GEN2, "causes": SPARK_CAUSES, "raw_gen2": SPARK_RAW_GEN2}
    done = subprocess.run(
        [sys.executable, "-c", SPARK_SCRIPT, out_dir, json.dumps(queries)],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYSPARK_PYTHON=sys.executable),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("ANSWERS "))
    return json.loads(line[len("ANSWERS ") :])


@pytest.fixture(scope="module")
def fleet_export(fleet_dbs, tmp_path_factory):
    require_spark()
    out = tmp_path_factory.mktemp("fleet-export") / "parquet"
    for host, daemon in fleet_dbs.items():
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "stallscope.cli",
                "export",
                "parquet",
                "--db",
                daemon.db,
                "--host",
                host,
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
    return str(out)


def test_spark_and_duckdb_give_the_same_fleet_answer(fleet_dbs, fleet_export):
    require_spark()
    spark = run_spark(fleet_export)
    assert spark["types"]["host"] == "string" and spark["types"]["date"] == "date"
    assert spark["types"]["start_ns"] == "bigint" and spark["types"]["slow"] == "boolean"

    fleet = open_fleet(fleet_export)
    duck_gen2 = {
        r[0]: (r[1], r[2])
        for r in fleet.execute("SELECT host, gen2_passes, gen2_stalls FROM fleet_gen2").fetchall()
    }
    duck_causes = {
        (r[0], r[1]): (r[2], float(r[3]), float(r[4]))
        for r in fleet.execute(
            "SELECT host, cause, slow_steps, share_of_slow, share_of_steps FROM fleet_slow_causes"
        ).fetchall()
    }
    spark_gen2 = {r["host"]: (r["gen2_passes"], r["gen2_stalls"]) for r in spark["answers"]["gen2"]}
    spark_causes = {
        (r["host"], r["cause"]): (
            r["slow_steps"],
            float(r["share_of_slow"]),
            float(r["share_of_steps"]),
        )
        for r in spark["answers"]["causes"]
    }
    spark_raw = {r["host"]: r["passes"] for r in spark["answers"]["raw_gen2"]}

    assert set(spark_gen2) == set(HOSTS)
    assert spark_gen2 == duck_gen2
    assert spark_causes == duck_causes
    # the raw tables Spark reads agree with the derived ones
    assert spark_raw == {h: g[0] for h, g in spark_gen2.items()}
    # and both are each host's own answer
    for host, daemon in fleet_dbs.items():
        passes, stalls = daemon.query("SELECT count(*), count(*) FILTER (stall) FROM seed_gen2")[0]
        assert spark_gen2[host] == (passes, stalls) and passes > 0
        own = dict(
            daemon.query("SELECT cause, count(*) FROM step_attribution WHERE slow GROUP BY cause")
        )
        assert {c: v[0] for (h, c), v in spark_causes.items() if h == host} == own
    # the two hosts differ (distinct runs, not one export read twice)
    assert spark_gen2["gpu-a"] != spark_gen2["gpu-b"]
