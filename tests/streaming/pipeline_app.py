"""The Spark application of the exactly-once crash test (run as a subprocess, killed at random).

Kafka topic -> ``s.raw`` (root job ``ingest``: the lakestep-kafka source and the
lakestep sink) -> ``s.agg`` (derived job ``agg``: the lakestep source, a
per-record transformation, the lakestep sink) [-> ``s.agg2`` (derived job
``agg2`` of ``s.agg``, with ``--derived2``)]. A barrier coordinator seals
epochs every ``--interval`` seconds in this driver.

    python -m tests.streaming.pipeline_app --catalog URL --bootstrap HOST:PORT --topic T --checkpoints DIR
        [--storage NAME=VALUE ...]   # storage options of an S3 warehouse (Spark options storage.NAME)
        [--derived2]                 # the second derived job
    spark-submit --master spark://... --py-files lakestep.zip tests/streaming/pipeline_app.py ...
                                     # on a cluster (tests/streaming/test_cluster.py): the master and
                                     # lakestep are spark-submit's, and register() checks the executors

The tables and the derived jobs must exist (the test creates them). The process
exits with status 3 when a query fails (e.g. a failpoint killed the Python
worker of a commit), prints ``EXECUTORS ...`` (what register() found the
Python workers import) and ``READY`` once the queries run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def transform(df):  # type: ignore[no-untyped-def]
    """The derived job's function of the root table (the test applies it to s.raw with pyarrow)."""
    return df.selectExpr("partition", "offset", "key", "upper(value) AS v", "CAST(length(value) AS INT) AS n")


def transform2(df):  # type: ignore[no-untyped-def]
    """The second derived job's function of s.agg (exact integers)."""
    return df.selectExpr("partition", "offset", "CAST(n AS BIGINT) * 1000 + partition AS m")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--catalog", required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--checkpoints", required=True)
    # one barrier per derived micro-batch (every barrier a consistent point; the source's maxBarriersPerTrigger
    # is left at its default, 1), so the seal interval must exceed a micro-batch's duration or the derived job
    # falls further behind forever
    ap.add_argument("--interval", type=float, default=3.0)
    ap.add_argument("--trigger", default="500 milliseconds")
    ap.add_argument("--max-offsets", type=int, default=60)
    ap.add_argument("--storage", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--derived2", action="store_true")
    # start each query once the one before has its sources up: fewer Python processes starting at once (the driver
    # JVM gives each 10 s to connect back, which a loaded 2-core machine can exceed)
    ap.add_argument("--stagger", action="store_true")
    args = ap.parse_args(argv)

    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # run by spark-submit: its master, its --py-files


    from lakestep.catalog.storage import Storage
    from lakestep.services import Coordinator
    from lakestep.streaming import register
    from lakestep.streaming.catalog_cache import open_catalog
    from lakestep.testing.spark import local_session

    storage = Storage.of(dict(kv.split("=", 1) for kv in args.storage))
    opts = storage.spark_options()  # the driver opens the catalog with them and ships them to executors

    ck = Path(args.checkpoints)
    spark = local_session("lakestep-pipeline-app", ck, master=None if submitted else "local",
                          pythonpath=None if submitted else REPO_ROOT,
                          jvm_options="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                          conf={"spark.sql.streaming.stopTimeout": "10s"})
    print(f"EXECUTORS {register(spark)}", flush=True)

    coord = Coordinator(open_catalog(args.catalog, storage), interval=args.interval, lease_seconds=3.0,
                                                             retain_count=None)
    coord.start()

    raw = (spark.readStream.format("lakestep-kafka").option("kafka.bootstrap.servers", args.bootstrap)
           .option("subscribe", args.topic).option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", args.max_offsets).load()
           .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value", "partition", "offset"))
    ingest = (raw.writeStream.format("lakestep").option("catalog", args.catalog).option("table", "s.raw")
              .options(**opts)
              .option("job", "ingest").option("checkpointLocation", str(ck / "ingest")).queryName("ingest")
              .trigger(processingTime=args.trigger).start())
    def settled(q):  # type: ignore[no-untyped-def]
        """--stagger: wait until query ``q`` is past "Initializing sources" (or failed)."""
        deadline = time.monotonic() + 300
        while args.stagger and q.isActive and q.status["message"].startswith("Initializ") \
                and time.monotonic() < deadline:
            try:
                q.awaitTermination(0.1)  # a wait on the query, over at once when it ends
            except Exception:  # it failed: awaitAnyTermination below reports it and exits 3
                break
        return q

    settled(ingest)
    src = (spark.readStream.format("lakestep").option("catalog", args.catalog).option("table", "s.raw")
           .options(**opts).option("job", "agg").load())
    agg = (transform(src).writeStream.format("lakestep").option("catalog", args.catalog).option("table", "s.agg")
           .options(**opts)
           .option("job", "agg").option("checkpointLocation", str(ck / "agg")).queryName("agg")
           .trigger(processingTime=args.trigger).start())
    queries = [ingest, settled(agg)]
    if args.derived2:
        src2 = (spark.readStream.format("lakestep").option("catalog", args.catalog).option("table", "s.agg")
                .options(**opts).option("job", "agg2").load())
        queries.append(transform2(src2).writeStream.format("lakestep").option("catalog", args.catalog)
                       .option("table", "s.agg2").options(**opts).option("job", "agg2")
                       .option("checkpointLocation", str(ck / "agg2")).queryName("agg2")
                       .trigger(processingTime=args.trigger).start())
    print("READY", flush=True)
    try:
        spark.streams.awaitAnyTermination()
    except Exception as e:  # a failed query: report and die like a crashed driver
        print(f"QUERY FAILED: {str(e).splitlines()[0][:2000]}", flush=True)
        for q in queries:
            if q.exception() is not None:
                print(f"  {q.name}: {str(q.exception())[:3000]}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
