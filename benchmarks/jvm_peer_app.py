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
   ``{"op": "pipeline", "format": "delta"|"iceberg", "bootstrap", "topic", "trigger", "name"}``: the
   freshness pipeline of benchmarks.freshness in that format (three tables raw, d1, d2 made empty
   first; Spark's ``kafka`` source -> raw, raw's streaming source -> d1 (``id * 2 + 1 AS v``), d1's ->
   d2 (``v % 1000 AS w``), every query ``processingTime=trigger``), started; the answer: where the three
   tables are (``locations``: Delta paths, or Iceberg table folders of the Hadoop catalog).
   ``{"op": "pipeline_status", "name"}``: ``{"failed": text or null}``; ``{"op": "pipeline_stop",
   "name"}`` stops its queries and answers each query's batches and median ``durationMs``.
   ``{"op": "sink", "format": "delta"|"iceberg", "rows_per_batch", "batches", "name"}``:
   benchmarks.streaming.run_sink (the ``rate-micro-batch`` frame into that sink, batch_stats of the
   kept batches and ``table_rows``).
   ``{"op": "stop"}`` ends the application. An error answers ``{"error": text}``.

Not guaranteed: the answers' timings are those of this process; the benchmark interleaves requests
with its own runs so that only one of the two applications works at a time.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.freshness import EXPRS
from benchmarks.streaming import await_available_now, batch_stats, run_sink

COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")
FRESH_TABLES = {"raw": "id bigint, produced double, partition int, offset bigint",
                "d1": "id bigint, produced double, v bigint", "d2": "id bigint, produced double, w bigint"}
PIPELINES: dict[str, list[Any]] = {}


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
        "spark.sql.streaming.numRecentProgressUpdates": "100000",
        # Delta rebuilds a table's state in this many partitions after commits (its default, 50, is
        # sized for clusters: 7 s per micro-batch here); the session's cores, as the shuffles have
        "spark.databricks.delta.snapshotPartitions": "2",
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


def pipeline(spark: Any, work: Path, req: dict[str, Any]) -> dict[str, Any]:
    fmt, name = req["format"], req["name"].replace("-", "_")
    every = f"{int(round(req['trigger'] * 1000))} milliseconds"
    where, locations = {}, {}
    for t, ddl in FRESH_TABLES.items():
        if fmt == "delta":
            where[t] = locations[t] = str(work / f"fresh-{name}-{t}")
            spark.sql(f"CREATE TABLE delta.`{where[t]}` ({ddl}) USING delta")
        elif fmt == "iceberg":
            where[t] = f"bench.k.{name}_{t}"
            spark.sql(f"CREATE TABLE {where[t]} ({ddl}) USING iceberg")
            locations[t] = str(work / "iceberg-wh" / "k" / f"{name}_{t}")
        else:
            raise ValueError(f"unknown format {fmt!r}")

    def read(t: str) -> Any:
        return spark.readStream.table(where[t]) if fmt == "iceberg" else spark.readStream.format(fmt).load(where[t])

    def write(df: Any, t: str, job: str) -> Any:
        w = (df.writeStream.option("checkpointLocation", str(work / f"ck-fresh-{name}-{job}"))
             .trigger(processingTime=every).queryName(f"{name}-{job}"))
        return w.toTable(where[t]) if fmt == "iceberg" else w.format(fmt).start(where[t])

    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", req["bootstrap"])
           .option("subscribe", req["topic"]).option("startingOffsets", "earliest").load()
           .selectExpr("CAST(split(CAST(value AS STRING), ',')[0] AS BIGINT) AS id",
                       "CAST(split(CAST(value AS STRING), ',')[1] AS DOUBLE) AS produced", "partition", "offset"))
    PIPELINES[req["name"]] = [write(raw, "raw", "ingest"), write(read("raw").selectExpr(*EXPRS["d1"]), "d1", "d1"),
                              write(read("d1").selectExpr(*EXPRS["d2"]), "d2", "d2")]
    return {"locations": locations}


def pipeline_status(req: dict[str, Any]) -> dict[str, Any]:
    for q in PIPELINES[req["name"]]:
        if q.exception() is not None:
            return {"failed": f"query {q.name} failed: {str(q.exception())[:2000]}"}
    return {"failed": None}


def pipeline_stop(req: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for job, q in zip(("ingest", "d1", "d2"), PIPELINES.pop(req["name"])):
        q.stop()
        progress = [json.loads(p.json) for p in q.recentProgress]
        kept = [p for p in progress if p.get("numInputRows", 0) > 0]
        keys = sorted({k for p in kept for k in p["durationMs"]})
        out[job] = {"batches": len(kept), "median_ms": {k: statistics.median(p["durationMs"].get(k, 0) for p in kept)
                                                        for k in keys}}
    return out


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
            if req["op"] == "ingest":
                answer = ingest(spark, work, req)
            elif req["op"] == "pipeline":
                answer = pipeline(spark, work, req)
            elif req["op"] == "pipeline_status":
                answer = pipeline_status(req)
            elif req["op"] == "pipeline_stop":
                answer = pipeline_stop(req)
            elif req["op"] == "sink":
                (work / f"sink-{req['name']}").mkdir()
                answer = run_sink(spark, work / f"sink-{req['name']}", req["format"], req["rows_per_batch"],
                                  req["batches"])
            else:
                raise ValueError(f"unknown op {req['op']!r}")
        except Exception as e:  # the benchmark reports it in the row
            answer = {"error": f"{type(e).__name__}: {e}"[:3000], "trace": traceback.format_exc()[-3000:]}
        print(json.dumps(answer), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
