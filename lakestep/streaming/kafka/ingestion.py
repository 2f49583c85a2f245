"""Kafka into a lakestep table without Spark's row hand-offs: :func:`ingest`.

``format("lakestep-kafka")`` into ``format("lakestep")`` moves every record
through Spark twice: the source's Python worker hands its Arrow batches to the
JVM, which hands them on to the sink's Python worker. For a root job that
lands the Kafka columns as they are, most of a trigger is spent there
(``benchmarks.streaming --only d``). :func:`ingest` runs the same query with
one difference: each task's Python worker reads its offset range and writes
the table's Parquet files itself, and only the list of files (one small row
per task) crosses Spark to the sink, which commits them::

    from lakestep.streaming.kafka import ingest

    q = (ingest(spark, url, "shop.raw", {"kafka.bootstrap.servers": "broker:9092",
                                         "subscribe": "orders"}, job="raw")
         .option("checkpointLocation", "/ck/raw").trigger(processingTime="10 seconds").start())

Every ``lakestep-kafka`` option applies (offsets, triggers, ``minPartitions``,
``failOnDataLoss``, ...). The table's columns are taken by name from the
source's (``key``, ``value``, ``topic``, ``partition``, ``offset``,
``timestamp``, ``timestampType``, ``headers`` with ``includeHeaders``), with
the sink's rules (lossless widening; a nullable table column the source lacks
is null); any other column is refused before the query starts.

Protocol of one micro-batch (numbered as it runs):

1. driver (planning): the offset ranges, as ``lakestep-kafka`` plans them; the
   table's shape (location, schema, partitioning), read from the catalog when
   the query starts, goes to the tasks with them. Executors never talk to the
   catalog database;
2. executors: each task reads exactly its range ``[start, end)`` and writes it
   as Parquet files of the table (the sink's writer: ``BatchFiles``, files named
   ``b<batch>-p<partition>-a<attempt>-<uuid>.parquet``), then yields one row,
   ``_ls_files``: the list of files it wrote, for this table;
3. the ``lakestep`` sink's tasks gather those lists (a list for another table
   fails the task) and the driver publishes them in one catalog transaction,
   exactly as for any micro-batch of the sink (sink.py, step 2): idempotent per
   ``(job, batchId)``, so that a batch replayed after a crash, which reads the
   same offsets and writes them again, is recognised and its second copy of
   the files deleted.

Not guaranteed: the files of a task attempt that fails, or of a batch whose
commit never lands, are orphans until ``cleanup`` removes them (after the
table's retention window), as with the sink. The row of ``_ls_files`` is
lakestep's own plumbing: the ``lakestep-kafka-ingest`` format is meant to be
started by :func:`ingest` only (with another sink its files are never
committed), and only :func:`ingest` registers it.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Mapping
from typing import Any, cast

import pyarrow as pa
from pyspark.sql.types import BinaryType, StructField, StructType

from ...catalog.writes import conform
from ...errors import SchemaMismatchError
from ..catalog_cache import open_catalog, required, storage_of
from ..compat import DataSourceStreamReader, InputPartition, check_session, require

# the sink side of the protocol (step 3): STAGED_COLUMN is a task's row, gather reads it back
from ..sink import STAGED_COLUMN, StagedFiles, TableShape, gather, task_prefix  # noqa: F401  (gather: re-exported)
from .errors import KafkaOptionError
from .options import KafkaSourceOptions
from .schema import arrow_schema
from .source import KafkaDataSource, KafkaInputPartition, KafkaStreamReader

#: The format :func:`ingest` reads with.
INGEST_FORMAT = "lakestep-kafka-ingest"
STAGED_SCHEMA = StructType([StructField(STAGED_COLUMN, BinaryType())])
_STAGED_ARROW = pa.schema([pa.field(STAGED_COLUMN, pa.binary())])
#: The options of the table side (the rest are ``lakestep-kafka``'s).
_TABLE_OPTIONS = ("catalog", "table")


def _columns(shape: TableShape, include_headers: bool) -> list[str]:
    """The source columns the table takes, checked against the table (driver, before any file)."""
    source = arrow_schema(include_headers)
    columns = [f.name for f in shape.schema if source.get_field_index(f.name) >= 0]
    extra = [f.name for f in shape.schema if source.get_field_index(f.name) < 0 and not f.nullable]
    if extra:
        raise SchemaMismatchError(shape.ident, [
            f"non-nullable columns {extra} are not Kafka columns ({source.names}); {INGEST_FORMAT} lands the "
            "Kafka columns as they are (transform them in a derived job, or read with lakestep-kafka)"])
    if not columns:
        raise SchemaMismatchError(shape.ident, [f"the table has none of the Kafka columns {source.names}"])
    conform(source.empty_table().select(columns), shape.schema, shape.ident)  # types: refused here, not later
    return columns


def _check_row_format(options: KafkaSourceOptions) -> None:
    if options.row_format != "arrow":
        raise KafkaOptionError(f"{INGEST_FORMAT} writes the Arrow batches it reads: option rowFormat must be "
                               f"'arrow', got {options.row_format!r}", option="rowFormat")


class IngestStreamReader(KafkaStreamReader):
    """``lakestep-kafka``'s planning; each task writes its range as files of the table (step 2)."""

    def __init__(self, options: KafkaSourceOptions, shape: TableShape) -> None:
        _check_row_format(options)
        super().__init__(options)
        self.shape = shape
        self.columns = _columns(shape, options.include_headers)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # executors
        from pyspark import TaskContext

        from ..sink import BatchFiles

        assert isinstance(partition, KafkaInputPartition), partition
        arrow = cast("Iterator[pa.RecordBatch]", super().read(partition))  # rowFormat=arrow (_check_row_format)
        batches = (rb.select(self.columns) for rb in arrow)
        msg = BatchFiles(self.shape, None).write(batches, task_prefix(TaskContext.get()))
        staged = StagedFiles(files=msg.files, rows=msg.rows, table=self.shape.ident)
        yield pa.RecordBatch.from_pydict({STAGED_COLUMN: [pickle.dumps(staged)]}, _STAGED_ARROW)


class KafkaIngestSource(KafkaDataSource):
    """The ``lakestep-kafka-ingest`` format (started by :func:`ingest`): streaming only."""

    @classmethod
    def name(cls) -> str:
        return INGEST_FORMAT

    def _kafka_options(self) -> dict[str, Any]:
        return {k: v for k, v in self.options.items()
                if k.lower() not in _TABLE_OPTIONS and not k.lower().startswith("storage.")}

    def schema(self) -> StructType:
        from .options import check_common_options

        check_common_options(self._kafka_options())
        return STAGED_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = KafkaSourceOptions.from_options(self._kafka_options())
        url, table = required(self.options, "catalog"), required(self.options, "table")
        shape = TableShape.of(open_catalog(url, storage_of(self.options)).load_table(table))
        return IngestStreamReader(options, shape)

    def reader(self, schema: StructType) -> Any:
        raise KafkaOptionError(f"{INGEST_FORMAT} is for streaming queries (lakestep.streaming.kafka.ingest); a "
                               "batch read lands in a table with spark.read.format('lakestep-kafka') and a lakestep "
                               "write", option=None)


def ingest(spark: Any, url: str, table: str, options: Mapping[str, Any], *, job: str | None = None,
           storage_options: Mapping[str, Any] | None = None, catalog_wait_seconds: float | None = None) -> Any:
    """A root job from Kafka into ``table``: a ``DataStreamWriter`` to finish and ``start()``.

    ``options``: the ``lakestep-kafka`` options (``kafka.bootstrap.servers``,
    ``subscribe``, ``startingOffsets``, ``maxOffsetsPerTrigger``, ...). ``job``,
    ``storage_options`` and ``catalog_wait_seconds`` are the ``lakestep``
    sink's ``job``, ``storage.*`` and ``catalogWaitSeconds``. The table is
    checked here: a column that is no Kafka column and is not nullable, or a
    type the Kafka column cannot be widened to, raises
    :class:`~lakestep.errors.SchemaMismatchError` before anything runs.

    Same guarantees as ``lakestep-kafka`` into the ``lakestep`` sink (each
    micro-batch one commit on the open epoch, exactly once), with 1.3-1.4x
    its rows/s in ``benchmarks.streaming`` (b); see the module docstring for
    the protocol. ``rowFormat=tuples`` is refused here (ValueError).
    """
    from ..datasource import register

    require("kafka", check_session(spark))  # SparkVersionError before 4.2, naming what to use instead
    register(spark)  # the lakestep sink (and lakestep-kafka)
    spark.dataSource.register(KafkaIngestSource)  # registered here only: it is for ingest's queries alone
    storage = {f"storage.{k}": str(v) for k, v in (storage_options or {}).items()}
    # checked now, on the driver (the source checks again when the query plans its first batch)
    parsed = KafkaSourceOptions.from_options(dict(options))
    _check_row_format(parsed)
    _columns(TableShape.of(open_catalog(url, storage_of(storage)).load_table(table)),
             parsed.include_headers)
    df = (spark.readStream.format(INGEST_FORMAT).options(**{k: str(v) for k, v in options.items()})
          .options(**storage).option("catalog", url).option("table", table).load())
    w = df.writeStream.format("lakestep").option("catalog", url).option("table", table).options(**storage)
    if job is not None:
        w = w.option("job", job)
    if catalog_wait_seconds is not None:
        w = w.option("catalogWaitSeconds", str(catalog_wait_seconds))
    return w
