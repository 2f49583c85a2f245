"""The ``lakestep`` format for Spark, and the helpers around it.

Example (a root job from Kafka, a derived job from it)::

    from lakestep.streaming import register, register_job

    register(spark)                               # the "lakestep" and "lakestep-kafka" formats
    url = "sqlite:////data/wh/catalog.db"
    raw = (spark.readStream.format("lakestep-kafka")
           .option("kafka.bootstrap.servers", "broker:9092").option("subscribe", "orders").load())
    (raw.writeStream.format("lakestep").option("catalog", url).option("table", "shop.raw")
        .option("job", "ingest").option("checkpointLocation", "/data/ck/ingest").start())

    register_job(url, "daily", sources=["shop.raw"], sinks=["shop.daily"])
    src = (spark.readStream.format("lakestep").option("catalog", url)
           .option("table", "shop.raw").option("job", "daily").load())
    ...
"""

from __future__ import annotations

from typing import Any, Sequence

from pyspark.sql.datasource import DataSource

from . import progress


def _spark_schema(table: Any) -> str:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(table.schema).simpleString()


class LakestepDataSource(DataSource):
    """``format("lakestep")``: a streaming sink and a streaming source of lakestep tables."""

    @classmethod
    def name(cls) -> str:
        return "lakestep"

    def schema(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        cat = progress.open_catalog(progress.required(self.options, "catalog"))
        return from_arrow_schema(cat.load_table(progress.required(self.options, "table")).schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        from .sink import LakestepStreamWriter

        return LakestepStreamWriter(self.options, overwrite)  # case-insensitive keys

    def streamReader(self, schema: Any) -> Any:
        from .source import LakestepStreamReader

        return LakestepStreamReader(self.options)


def register(spark: Any) -> None:
    """Register the ``lakestep`` and ``lakestep-kafka`` formats with a SparkSession."""
    from .kafka import register_kafka_source

    spark.dataSource.register(LakestepDataSource)
    register_kafka_source(spark)


def register_job(url: str, job: str, *, sources: Sequence[str], sinks: Sequence[str]) -> None:
    """Register a derived job (before starting its query): which tables it reads and writes."""
    from ..barrier import Pipeline

    Pipeline(progress.open_catalog(url)).register_job(job, sources=sources, sinks=sinks)


def foreach_batch(url: str, table: str, *, job: str, mode: str = "append") -> Any:
    """A ``foreachBatch`` function with the sink's guarantees, for existing foreachBatch pipelines.

    Each micro-batch is collected to the driver as Arrow and committed in one
    transaction, idempotent per (job, batchId); a root job's commit takes the
    open epoch. Use the ``lakestep`` format for large batches: it writes from
    the executors.

    Example::

        df.writeStream.foreachBatch(foreach_batch(url, "shop.raw", job="ingest")).start()
    """
    from ..barrier import OPEN_EPOCH

    if mode not in ("append", "overwrite", "upsert"):
        raise ValueError("mode must be append, overwrite or upsert")
    cat = progress.open_catalog(url)
    progress.ensure_sink_registered(cat, job, table, None)

    def run(df: Any, batch_id: int) -> None:
        data = df.toArrow()
        with cat.transaction(job_id=job, batch_id=batch_id) as tx:
            if mode == "overwrite":
                tx.overwrite(table, data, barrier=OPEN_EPOCH)
            else:
                tx.append(table, data, barrier=OPEN_EPOCH)

    return run
