"""Driver of tests/streaming/test_cluster.py::test_spark_writer_counts_rows_on_a_cluster, run with
``spark-submit --py-files lakestep.zip`` on the test's standalone cluster.

    native_cluster_app.py CATALOG_URL TABLE LOCATION

Batch 0 of ``foreach_batch(..., writer="spark")`` is written by the cluster's executors and
committed. Batch 1 loses a file between Spark's write and the driver's listing (a failpoint on
the driver: what a driver that cannot see an executor's disk finds); Spark's count of the rows
it wrote must refuse the batch. Prints ``MASTER``, ``BATCH 0 committed``, then ``BATCH 1
refused: <message>`` (or ``BATCH 1 committed``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from lakestep import _failpoints
from lakestep.errors import StreamingJobError
from lakestep.streaming import foreach_batch


def main(url: str, table: str, location: str) -> None:
    spark = SparkSession.builder.appName("lakestep-native-cluster").getOrCreate()
    print(f"MASTER {spark.conf.get('spark.master')}", flush=True)
    write = foreach_batch(url, table, job="feed", writer="spark")
    write(spark.createDataFrame([(1, 10), (2, 20), (3, 30)], "id long, amount long").repartition(2), 0)
    print("BATCH 0 committed", flush=True)

    def lose_a_file(_: str) -> None:
        written = [f for f in Path(location).rglob("*.parquet") if "spark-b1-" in str(f)]
        next(f for f in written if pq.read_metadata(f).num_rows).unlink()

    _failpoints.arm("native.after_spark_write", lose_a_file)
    try:
        write(spark.createDataFrame([(4, 40), (5, 50)], "id long, amount long").repartition(2), 1)
        print("BATCH 1 committed", flush=True)
    except StreamingJobError as e:
        print(f"BATCH 1 refused: {e}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
