"""A Kafka source for Spark Structured Streaming written in Python.

``lakestep-kafka`` is a `Python Data Source
<https://spark.apache.org/docs/latest/api/python/tutorial/sql/python_data_source.html>`_
built on kafka-python. It stands in for Spark's own ``kafka`` source when the
``spark-sql-kafka`` connector jar is not on the classpath::

    from lakestep.streaming.kafka import register_kafka_source

    register_kafka_source(spark)
    df = (spark.readStream.format("lakestep-kafka")
          .option("kafka.bootstrap.servers", "host:9092")
          .option("subscribe", "orders,payments")
          .option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", 100_000)
          .load())

Schema (identical to Spark's Kafka source; every column nullable)::

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp, timestampType int [, headers array<struct<key string, value binary>>]

``headers`` is only present with ``includeHeaders=true``.

Options (names are case-insensitive, like every Spark option):

=================================  ==========================================================
``kafka.bootstrap.servers``        required; comma-separated ``host:port`` list.
``subscribe``                      comma-separated topic names; or ``subscribePattern`` (a
                                   regex matched against whole topic names, re-read every
                                   trigger) or ``assign`` (JSON ``{"t": [0, 1]}``): exactly one.
``startingOffsets``                ``latest`` (default, as in Spark), ``earliest``, or JSON
                                   ``{"topic": {"0": 23, "1": -2}}`` naming *every*
                                   partition of the subscribed topics (-2 = earliest,
                                   -1 = latest). Only used when a query starts without a
                                   checkpoint.
``maxOffsetsPerTrigger``           cap on records per micro-batch, spread over partitions in
                                   proportion to their backlog (Spark's algorithm). Also
                                   honoured by ``trigger(availableNow=True)``.
``minOffsetsPerTrigger``           no batch while fewer new offsets are available, until
                                   ``maxTriggerDelay`` (default ``15m``) has passed since the
                                   last batch (Spark's rule; not with ``availableNow``).
``minPartitions``                  split the offset ranges of a micro-batch into at least
                                   this many Spark tasks when there are fewer Kafka
                                   partitions with data (Spark's algorithm: large ranges
                                   are cut in proportion to their size), so that a topic
                                   with few partitions still uses every core. Default: one
                                   task per Kafka partition.
``maxRecordsPerPartition``         no task reads more than this many offsets of a
                                   partition: larger ranges are cut into consecutive pieces
                                   first, then ``minPartitions`` applies (Spark's order).
``includeHeaders``                 ``false`` (default) / ``true``.
``failOnDataLoss``                 ``true`` (default): offsets that vanished from the log, a
                                   topic deleted or recreated, fail the query
                                   (KafkaDataLossError). ``false``: one warning per event,
                                   reading goes on from what is there; counts in the progress
                                   report's ``latestOffset`` under ``"$dataLoss"``.
``kafkaConsumer.pollTimeoutMs``    executor-side: fail a task whose partition makes no
                                   progress for this long (default 120000).
``fetchOffset.timeoutMs``          driver-side: bound on each metadata / offset lookup
                                   (default 60000).
``rowFormat``                      ``arrow`` (default: ``read()`` yields
                                   ``pyarrow.RecordBatch``) or ``tuples`` (one Python tuple
                                   per record; slower, kept for diagnosis).
``kafka.*``                        passed to kafka-python's ``KafkaConsumer``, see
                                   :func:`kafka_consumer_config` for the name mapping.
=================================  ==========================================================

docs/kafka.md compares every option with Spark's own Kafka source (same,
different, refused and why); a test keeps that table in step with the parser.

Batch reads (``spark.read.format("lakestep-kafka")``, e.g. for backfills) read
``[startingOffsets, endingOffsets)`` of every partition, ``earliest`` to
``latest`` by default (as Spark; ``startingOffsets=latest`` and
``endingOffsets=earliest`` are refused), resolved once on the driver.

Guarantees:

* Offsets live only in Spark's checkpoint. The offset JSON is
  ``{"topic": {"partition": next_offset_to_read}}`` (topics and partitions in
  sorted order). No consumer group is joined and nothing is committed to Kafka
  (``assign()`` + ``seek()`` only).
* Each micro-batch reads exactly the half-open range ``[start, end)`` of every
  partition (one Spark input partition per Kafka partition with new data, or
  several consecutive sub-ranges with ``minPartitions``), so a batch replayed after a failure or a restart from the checkpoint yields the
  same records: combined with an idempotent/transactional sink this is
  exactly-once.
* The end of a partition is the *high watermark reported in a Fetch response*,
  not ListOffsets(latest): some brokers (tansu 0.6) answer the latter with the
  base offset of the last record batch + 1, which would silently hold back the
  tail of the log.
* Every wait on the broker is bounded (``fetchOffset.timeoutMs`` on the driver,
  ``kafkaConsumer.pollTimeoutMs`` of no progress on executors).

Not guaranteed / not supported:

* ``read_committed`` reads: ``kafka.isolation.level`` may be set, but the end
  offset is the high watermark, so with open transactions a task can wait for
  records that are not yet readable until ``kafkaConsumer.pollTimeoutMs``.
* Offsets from timestamps (``startingTimestamp``, ``startingOffsetsByTimestamp``,
  ``endingTimestamp``, ``endingOffsetsByTimestamp``) are checked against the
  records and searched for when the broker's answer is wrong (docs/kafka.md);
  the search assumes timestamps that do not decrease along the log.
* Partitions and topics added while a query runs are found at the next trigger
  (metadata is read every trigger) and are read from their earliest offset (as
  Spark does).
* Codecs: gzip, snappy, lz4 and zstd (the ``spark`` extra installs their
  libraries). A batch that cannot be decoded fails the task with
  ``KafkaDecodeError`` naming topic, partition and offset.
* ``startingOffsets=latest`` is resolved when the query first asks for it; if
  the query dies before its first batch is committed, a restart resolves it
  again (Spark's own Kafka source keeps its initial offsets in the checkpoint;
  a Python data source is not given the checkpoint directory).
* Without ``minPartitions`` or ``maxRecordsPerPartition`` large backlogs are not
  split: one Spark task reads a partition's whole range in a batch. Bound
  batches with ``maxOffsetsPerTrigger``.

Performance: with ``rowFormat=arrow`` executors do not let kafka-python decode
records one by one (~8-10 µs per small record and core, most of a Kafka
read): the raw record batches of each Fetch response are decoded column-wise
with numpy straight into Arrow arrays (:mod:`.decode`, ~1 µs per small record),
while connections, security, fetching, positions and errors stay
kafka-python's. This relies on one kafka-python internal (the fetcher's
``PartitionRecords`` class); with another kafka-python, with
``kafka.isolation.level=read_committed`` or ``rowFormat=tuples``, records are
decoded by kafka-python as before. Installing the ``crc32c`` package
(``kafka-python[crc32c]``) makes CRC checks native; ``kafka.check.crcs=false``
skips them. Each micro-batch also costs the Spark scheduling overhead of a few
hundred milliseconds to a second in local mode, so larger
``maxOffsetsPerTrigger`` values amortize it better. Into a lakestep table,
:func:`ingest` (:mod:`.ingestion`) skips Spark's two row hand-offs (source
worker to JVM to sink worker): each task writes its range as the table's files.

Needs pyspark >= 4.2 (admission control: ``latestOffset(start, limit)``).

Modules: ``options`` (option parsing), ``consumer_config`` (``kafka.*`` options to
kafka-python settings), ``offsets`` (offset JSON, rate limit,
driver-side offset client), ``reader`` (executor side), ``batches`` (record batch
framing, the kafka-python hook), ``decode`` (column-wise record batch decoding), ``source`` (the Spark
data source), ``schema``, ``errors``. The public names (``__all__``) are
importable from this package, loaded on first use, so importing the package
itself needs neither pyspark nor kafka-python; everything else is imported
from its module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import _lazy

if TYPE_CHECKING:  # for type checkers; loaded lazily by __getattr__ at run time
    from .consumer_config import kafka_consumer_config
    from .errors import (
        KafkaDataLossError,
        KafkaDecodeError,
        KafkaOptionError,
        KafkaSourceError,
        KafkaSourceTimeoutError,
        KafkaTimestampNotFoundError,
        KafkaTopicNotFoundError,
    )
    from .ingestion import ingest
    from .options import FORMAT_NAME, KafkaSourceOptions, parse_starting_offsets
    from .schema import arrow_schema, kafka_schema
    from .source import KafkaBatchReader, KafkaDataSource, KafkaInputPartition, KafkaStreamReader, register_kafka_source

#: The package's public names and the module each lives in. Everything else is
#: imported from its module (``from lakestep.streaming.kafka.offsets import ...``).
_PUBLIC: dict[str, str] = {
    **dict.fromkeys(["KafkaSourceError", "KafkaTopicNotFoundError", "KafkaDataLossError", "KafkaDecodeError",
                     "KafkaSourceTimeoutError", "KafkaTimestampNotFoundError", "KafkaOptionError"], "errors"),
    **dict.fromkeys(["FORMAT_NAME", "KafkaSourceOptions", "parse_starting_offsets"], "options"),
    "kafka_consumer_config": "consumer_config",
    **dict.fromkeys(["kafka_schema", "arrow_schema"], "schema"),
    "ingest": "ingestion",
    **dict.fromkeys(["KafkaBatchReader", "KafkaDataSource", "KafkaInputPartition", "KafkaStreamReader",
                     "register_kafka_source"],
                    "source"),
}
__all__ = [  # a literal list, so that linters see the lazy names as exported (== sorted(_PUBLIC))
    "FORMAT_NAME", "KafkaBatchReader", "KafkaDataLossError", "KafkaDataSource", "KafkaDecodeError",
    "KafkaInputPartition", "KafkaOptionError", "KafkaSourceError", "KafkaSourceOptions", "KafkaSourceTimeoutError",
    "KafkaStreamReader", "KafkaTimestampNotFoundError", "KafkaTopicNotFoundError", "arrow_schema", "ingest",
    "kafka_consumer_config", "kafka_schema", "parse_starting_offsets", "register_kafka_source",
]


__getattr__, __dir__ = _lazy.exports(__name__, _PUBLIC)
