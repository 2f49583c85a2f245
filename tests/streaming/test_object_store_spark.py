"""Spark on an S3 warehouse: executors write and read the bucket, never list or rename.

Batch writes and reads (``format("lakestep")``), merge on read on executors,
``spark_sql`` over a :class:`Catalog` object, and a derived streaming job
(lakestep source -> lakestep sink, ``availableNow``), all with the warehouse
on the S3 server of the tests (tests/s3server.py). The storage options reach
the executors only through the Spark options ``storage.<name>`` and the
driver (this process has no AWS variables). The server's request log shows
the executors' writes (PUTs of the committed files) and no listing and no
copy at all.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pytest

from lakestep.barrier import Pipeline
from lakestep.errors import StreamingJobError
from lakestep.query import spark_sql
from lakestep.services import Coordinator
from lakestep.streaming import foreach_batch, register, register_job
from tests.s3server import S3Server, summary

pytestmark = pytest.mark.spark

ORDERS = pa.schema([("id", pa.int64()), ("customer", pa.string()), ("cents", pa.int64())])
KEYED = pa.schema([("k", pa.int64()), ("v", pa.int64())])


@pytest.mark.parametrize("catalog_spec", ["postgres-s3"], indirect=True)
def test_spark_on_an_s3_warehouse(spark, catalog_spec, s3_server: S3Server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    reach = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")
    assert not [k for k in reach if k in os.environ]  # only the options reach the store
    cat = catalog_spec.open()
    cat.create_namespace("s")
    orders = cat.create_table("s.orders", ORDERS, partition_by=["customer"])
    keyed = cat.create_table("s.keyed", KEYED, primary_key=["k"])
    cents = cat.create_table("s.cents", pa.schema([("id", pa.int64()), ("double", pa.int64())]))
    p = Pipeline(cat)
    p.register_job("feed", sinks=["s.orders"], external_input=True)
    register_job(catalog_spec.url, "double", sources=["s.orders"], sinks=["s.cents"])
    coord = Coordinator(p.catalog, interval=3600)
    assert coord.acquire()
    register(spark)
    url, opts = catalog_spec.url, cat.storage.spark_options()

    def write(rows: list[tuple[Any, ...]], schema: str, table: str, mode: str = "append", **extra: str) -> None:
        (spark.createDataFrame(rows, schema).write.format("lakestep").option("catalog", url)
         .option("table", table).options(**opts).options(**extra).mode(mode).save())

    def read(table: str, **extra: str) -> list[tuple[Any, ...]]:
        df = (spark.read.format("lakestep").option("catalog", url).option("table", table).options(**opts)
              .options(**extra).load())
        return sorted(tuple(r) for r in df.collect())

    with pytest.raises(StreamingJobError, match="object store"):  # Spark's own writer: file systems only
        foreach_batch(url, "s.orders", job="feed", writer="spark", storage_options=dict(catalog_spec.storage))

    start = s3_server.mark()
    # executors write; the driver commits (root job feed: the open epoch)
    write([(1, "a", 10), (2, "b", 20), (3, "a", 30)], "id long, customer string, cents long", "s.orders",
          job="feed", batchId="1")
    write([(1, "a", 10), (2, "b", 20), (3, "a", 30)], "id long, customer string, cents long", "s.orders",
          job="feed", batchId="1")  # a replay: one commit; its files are deleted
    coord.seal()
    write([(4, "c", 40)], "id long, customer string, cents long", "s.orders", job="feed", batchId="2")
    write([(1, 1), (2, 2)], "k long, v long", "s.keyed")
    write([(2, 20), (3, 30)], "k long, v long", "s.keyed")  # an upsert: merged on read by executors
    # executors read
    assert read("s.orders") == [(1, "a", 10), (2, "b", 20), (3, "a", 30), (4, "c", 40)]
    assert read("s.orders", barrier="1") == [(1, "a", 10), (2, "b", 20), (3, "a", 30)]
    assert read("s.keyed") == [(1, 1), (2, 20), (3, 30)]
    res = spark_sql(spark, cat, "SELECT o.id, k.v FROM s.orders o JOIN s.keyed k ON o.id = k.k")
    assert sorted(tuple(r) for r in res.df.collect()) == [(1, 1), (2, 20), (3, 30)]  # orders at barrier 1
    res.release()
    # a derived streaming job: the lakestep source's executors read, the sink's write
    src = (spark.readStream.format("lakestep").option("catalog", url).option("table", "s.orders")
           .options(**opts).option("job", "double").load())
    q = (src.selectExpr("id", "cents * 2 AS double").writeStream.format("lakestep").option("catalog", url)
         .option("table", "s.cents").options(**opts).option("job", "double")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None
    assert sorted(tuple(r.values()) for r in cents.to_arrow().to_pylist()) == [(1, 20), (2, 40), (3, 60)]
    assert p.frontier("s.cents") == 1

    reqs = s3_server.requests(start)
    bad = [r for r in reqs if r.is_list or r.is_copy]
    assert not bad, f"listed or copied: {summary(bad)}"
    put = {r.path.rsplit("/", 1)[1] for r in reqs if r.method == "PUT" and r.path.endswith(".parquet")}
    committed = {f.path.rsplit("/", 1)[1] for t in (orders, keyed, cents) for f in t.refresh().files()}
    assert committed <= put  # the executors wrote every committed file, under its final name
    coord.release()
    cat.close()
