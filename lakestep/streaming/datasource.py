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

import pickle
from typing import Any, Callable, Mapping, Sequence

from ..catalog.storage import Storage
from ..errors import InvalidArgumentError
from . import compat
from .catalog_cache import open_catalog, required, storage_of
from .compat import DataSource


class LakestepDataSource(DataSource):
    """``format("lakestep")``: batch reads and writes (batch_io.py), a streaming sink (sink.py)
    and a streaming source (source.py) of lakestep tables."""

    @classmethod
    def name(cls) -> str:
        return "lakestep"

    def schema(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        cat = open_catalog(required(self.options, "catalog"), storage_of(self.options))
        if any(self.options.get(k) not in (None, "") for k in ("versionasof", "timestampasof", "snapshot", "barrier")):
            from .batch_io import read_plan  # time travel: the schema of the version read (ls_schema)

            return from_arrow_schema(read_plan(cat, required(self.options, "table"), self.options).schema)
        return from_arrow_schema(cat.load_table(required(self.options, "table")).schema)

    def reader(self, schema: Any) -> Any:
        from .batch_io import LakestepBatchReader

        return LakestepBatchReader(self.options, schema)

    def writer(self, schema: Any, overwrite: bool) -> Any:
        from .batch_io import LakestepBatchWriter

        return LakestepBatchWriter(self.options, overwrite, schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        from .sink import LakestepStreamWriter

        compat.require("sink")  # Spark 4.1: Arrow batches to a Python stream writer

        return LakestepStreamWriter(self.options, overwrite, schema)  # case-insensitive keys

    def streamReader(self, schema: Any) -> Any:
        from .source import LakestepStreamReader

        compat.require("source")  # Spark 4.2: admission control hands latestOffset its start

        return LakestepStreamReader(self.options)


def register(spark: Any, *, check_executors: bool = True) -> Any:
    """Register the ``lakestep`` and ``lakestep-kafka`` formats with a SparkSession.

    It first checks, once per application, that Spark's Python workers can
    import lakestep (executors.py), in local mode too (``PYSPARK_PYTHON`` may
    name another interpreter than the driver's): a missing or different
    lakestep raises :class:`~lakestep.errors.SparkSetupError` naming the
    interpreter and the fix here, instead of failing every query later with
    "Failed to create Python data source instance". Returns what the workers
    import (:class:`~lakestep.streaming.executors.ExecutorLakestep` list), or
    None when not checked (``check_executors=False``, checked before, Spark Connect).

    The formats are Python data sources (Spark 4.0); on Spark 3.5 this raises
    :class:`~lakestep.errors.SparkVersionError` naming what to use there instead
    (``DerivedJob``, ``foreach_batch``, ``spark_sql``, ``spark_table``, which need no
    registration). What each Spark line runs: lakestep/streaming/compat.py.
    """
    compat.require("format", compat.check_session(spark))
    return prepare(spark, check_executors=check_executors)


def prepare(spark: Any, *, check_executors: bool = True) -> Any:
    """What ``DerivedJob``, ``spark_sql`` and ``ingest`` need of a session, on any supported Spark:
    the executors checked (as :func:`register`), the formats registered where Spark has Python
    data sources (4.0), nothing refused. Returns what :func:`register` returns."""
    from .executors import check_executors as _check

    at = compat.check_session(spark)
    found = _check(spark) if check_executors else None
    if compat.supports("format", at):
        from .kafka.source import register_kafka_source

        spark.dataSource.register(LakestepDataSource)
        register_kafka_source(spark)
    return found


def register_job(url: str, job: str, *, sources: Sequence[str], sinks: Sequence[str]) -> None:
    """Register a derived job (before starting its query): which tables it reads and writes.

    Raises:
        SparkVersionError: the job reads ``sources``, which a streaming query reads with the
            ``lakestep`` source: Spark 4.2 (lakestep/streaming/compat.py); before, a derived job
            runs as a :class:`~lakestep.streaming.DerivedJob`, which registers itself."""
    from ..barrier import Pipeline

    if sources:
        compat.require("source")

    Pipeline(open_catalog(url)).register_job(job, sources=sources, sinks=sinks)


def foreach_batch(url: str, table: str, *, job: str | None = None, mode: str = "append",
                  dead_letter_table: str | None = None, merge_schema: bool = False,
                  storage_options: Mapping[str, Any] | None = None,
                  writer: str = "arrow") -> Callable[[Any, int], None]:
    """A ``foreachBatch`` function with the sink's guarantees, for existing foreachBatch pipelines.

    Each micro-batch is written by the executors (``mapInArrow``: Parquet files
    of the table, rows conformed to its schema, ``_ls_error`` rows to
    ``dead_letter_table``) and published on the driver in one catalog
    transaction, exactly as the ``lakestep`` sink does: idempotent per
    ``(job, batch_id)`` (a replayed batch after a crash is not committed
    twice); a root job's commit takes the open epoch; a derived job's commit
    (one whose query reads lakestep sources, registered with
    :func:`register_job`) carries the barrier its sources agreed on, and an
    empty batch still precommits it.

    ``mode``: ``append``; ``update`` (upsert into a primary-key table; alias
    ``upsert``); ``complete`` (replace the table's rows; alias ``overwrite``).
    ``merge_schema``: columns of a batch the table lacks are added to it as
    nullable columns (default: the batch is refused with
    :class:`~lakestep.errors.SchemaMismatchError` before anything is written).
    ``storage_options``: how the driver and the executors reach an object-store
    warehouse (as ``Catalog(storage_options=...)``; default: the AWS environment).
    ``writer``: ``"arrow"`` (default: the rows go to Python workers, which
    write the files, as in the ``lakestep`` sink) or ``"spark"`` (Spark's own
    Parquet writer writes them and the driver reads their footers: no Python
    worker sees the rows: 1.3-1.4x the arrow writer's rows/s in
    ``benchmarks.streaming`` (a);
    for tables without a primary key or dead-letter table, on a file-system
    location: :mod:`lakestep.streaming.native`).
    Files of a batch whose Spark job fails midway are orphans that cleanup
    removes after the retention window.

    Example::

        q = (df.writeStream.foreachBatch(foreach_batch(url, "shop.raw", job="ingest"))
               .option("checkpointLocation", "/ck/ingest").start())
    """
    from .sink import SinkTarget, task_writer

    mode = {"overwrite": "complete", "upsert": "update"}.get(mode, mode)
    storage = Storage.of(storage_options)
    if writer not in ("arrow", "spark"):
        raise InvalidArgumentError(f"writer must be 'arrow' or 'spark', got {writer!r}", argument="writer",
                                   value=writer)
    if writer == "spark":
        from .native import check_target

        check_target(open_catalog(url, storage).load_table(table), dead_letter_table)
    target = SinkTarget.open(url, table, job=job, mode=mode, dead_letter=dead_letter_table, storage=storage)

    def run(df: Any, batch_id: int) -> None:
        nonlocal target
        if target.lacks(df.columns):  # new columns: refused, or added (merge_schema)
            target = SinkTarget.open(url, table, job=job, mode=mode, dead_letter=dead_letter_table,
                                     schema=df.schema, merge_schema=merge_schema, storage=storage)
        if writer == "spark":
            from .native import write

            messages = [write(df, target, batch_id)]
        else:
            messages = [pickle.loads(r[0]) for r in df.mapInArrow(task_writer(target, batch_id), "m binary").collect()]
        target.commit(messages, batch_id)

    return run

