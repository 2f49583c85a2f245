"""The JVM peers' side of benchmarks.jvm_peers: one Spark application of the peers' Spark (scripts/jars.py:
pyspark of jars/pom.xml, with Spark's Kafka source, Delta Lake and Iceberg's Spark runtime), serving
the benchmark's requests one at a time. Run by benchmarks/jvm_peers.py in the peers' virtualenv:

    python -m benchmarks.jvm_peer_app WORKDIR JARS...

1. Starts a local[2] session like the benchmark's own (lakestep.testing.spark.local_session) with the
   jars, Delta's and Iceberg's session extensions, Delta's catalog as the session catalog and an
   Iceberg catalog ``bench`` (Iceberg's Hadoop catalog under WORKDIR); prints ``ready`` on stdout.
2. Reads one JSON request a line on stdin, answers one JSON line on stdout:
   ``{"op": "ingest", "sink": "delta"|"iceberg"|"parquet", "bootstrap", "topic", "max_per_trigger",
   "name"}``: Spark's own ``kafka`` source from the topic's start into a fresh table of that format,
   ``availableNow``; the answer: benchmarks.streaming.batch_stats of its progress (rows/s = rows /
   the triggers' time), ``wall_s``, and what landed (``table_rows``, ``distinct_offsets``).
   ``{"op": "stop"}`` ends the application. An error answers ``{"error": text}``.

Not guaranteed: the answers' timings are those of this process; the benchmark interleaves requests
with its own runs so that only one of the two applications works at a time.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.streaming import await_available_now, batch_stats

COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")


def session(work: Path, jars: list[str]) -> Any:
    from lakestep.testing.spark import local_session

    return local_session("lakestep-bench-jvm-peers", work, conf={
        "spark.jars": ",".join(jars),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension,"
                                "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.catalog.bench": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.bench.type": "hadoop",
        "spark.sql.catalog.bench.warehouse": str(work / "iceberg-wh"),
        "spark.sql.warehouse.dir": str(work / "spark-warehouse"),
        "spark.sql.streaming.stopTimeout": "60s",
    })


def ingest(spark: Any, work: Path, req: dict[str, Any]) -> dict[str, Any]:
    sink, name = req["sink"], req["name"]
    src = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", req["bootstrap"])
           .option("subscribe", req["topic"]).option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", req["max_per_trigger"]).load().select(*COLUMNS))
    ck, path = work / f"ck-{name}", work / f"{sink}-{name}"
    t0 = time.perf_counter()
    w = src.writeStream.option("checkpointLocation", str(ck)).trigger(availableNow=True).queryName(name)
    if sink == "iceberg":
        table = f"bench.k.{name.replace('-', '_')}"
        spark.sql(f"CREATE TABLE {table} (key binary, value binary, topic string, partition int, offset bigint, "
                  "timestamp timestamp) USING iceberg")
        q = w.toTable(table)
    else:
        q = w.format(sink).start(str(path))
    await_available_now(q)
    wall = time.perf_counter() - t0
    stats = batch_stats([json.loads(p.json) for p in q.recentProgress])
    stats["wall_s"] = round(wall, 3)
    landed = spark.table(table) if sink == "iceberg" else spark.read.format(sink).load(str(path))
    stats["table_rows"] = landed.count()
    stats["distinct_offsets"] = landed.select("partition", "offset").distinct().count()
    return stats


def main(argv: list[str]) -> int:
    work, jars = Path(argv[0]), argv[1:]
    work.mkdir(parents=True, exist_ok=True)
    spark = session(work, jars)
    spark.sql("CREATE NAMESPACE IF NOT EXISTS bench.k")
    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "stop":
            break
        try:
            if req["op"] != "ingest":
                raise ValueError(f"unknown op {req['op']!r}")
            answer = ingest(spark, work, req)
        except Exception as e:  # the benchmark reports it in the row
            answer = {"error": f"{type(e).__name__}: {e}"[:3000], "trace": traceback.format_exc()[-3000:]}
        print(json.dumps(answer), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
