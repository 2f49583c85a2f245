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
``subscribe``                      required; comma-separated topic names. ``assign`` and
                                   ``subscribePattern`` are not supported.
``startingOffsets``                ``latest`` (default, as in Spark), ``earliest``, or JSON
                                   ``{"topic": {"0": 23, "1": -2}}`` naming *every*
                                   partition of the subscribed topics (-2 = earliest,
                                   -1 = latest). Only used when a query starts without a
                                   checkpoint.
``maxOffsetsPerTrigger``           cap on records per micro-batch, spread over partitions in
                                   proportion to their backlog (Spark's algorithm). Also
                                   honoured by ``trigger(availableNow=True)``.
``includeHeaders``                 ``false`` (default) / ``true``.
``failOnDataLoss``                 only ``true`` (the default) is supported: offsets that
                                   vanished from the log fail the query.
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

Guarantees:

* Offsets live only in Spark's checkpoint. The offset JSON is
  ``{"topic": {"partition": next_offset_to_read}}`` (topics and partitions in
  sorted order). No consumer group is joined and nothing is committed to Kafka
  (``assign()`` + ``seek()`` only).
* Each micro-batch reads exactly the half-open range ``[start, end)`` of every
  partition, one Spark input partition per Kafka partition with new data, so a
  batch replayed after a failure or a restart from the checkpoint yields the
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
* Batch queries (``spark.read``), ``endingOffsets``, ``minPartitions``,
  ``assign``, ``subscribePattern``, ``failOnDataLoss=false``.
* Partitions added to a topic while a query runs are discovered at most every
  30 seconds and are read from their earliest offset (as Spark does).
* ``startingOffsets=latest`` is resolved when the query first asks for it; if
  the query dies before its first batch is committed, a restart resolves it
  again (Spark's own Kafka source keeps its initial offsets in the checkpoint;
  a Python data source is not given the checkpoint directory).
* Large backlogs are not split: one Spark task reads a partition's whole range
  in a batch. Bound batches with ``maxOffsetsPerTrigger``.

Performance: decoding in kafka-python dominates (~10 µs per small record and
core). Installing the ``crc32c`` package (``kafka-python[crc32c]``) makes
kafka-python's CRC checks native, about 1.5x faster overall;
``kafka.check.crcs=false`` skips them. Each micro-batch also costs the Spark
scheduling overhead of about a second in local mode.

Needs pyspark >= 4.2 (admission control: ``latestOffset(start, limit)``).
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Literal, Union

import pyarrow as pa
import pyarrow.compute as pc

from lakestep.errors import LakestepError

try:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )
except ImportError as _exc:  # pragma: no cover - depends on the installed pyspark
    raise ImportError(
        "lakestep.streaming.kafka needs pyspark>=4.2 (Python data source admission control); "
        f"import failed: {_exc}"
    ) from _exc

if TYPE_CHECKING:
    from kafka import KafkaConsumer, TopicPartition
    from pyspark.sql import SparkSession

__all__ = [
    "FORMAT_NAME",
    "KafkaDataLossError",
    "KafkaDataSource",
    "KafkaInputPartition",
    "KafkaSourceError",
    "KafkaSourceOptions",
    "KafkaSourceTimeoutError",
    "KafkaStreamReader",
    "KafkaTopicNotFoundError",
    "arrow_schema",
    "kafka_consumer_config",
    "kafka_schema",
    "parse_starting_offsets",
    "rate_limit",
    "register_kafka_source",
]

logger = logging.getLogger(__name__)

FORMAT_NAME = "lakestep-kafka"
EARLIEST = -2
LATEST = -1

#: A Kafka partition as ``(topic, partition)``.
TP = tuple[str, int]
#: Offsets per partition.
Offsets = dict[TP, int]
#: ``startingOffsets``: ``"earliest"``, ``"latest"`` or explicit offsets (-2/-1 allowed).
StartingOffsets = Union[Literal["earliest", "latest"], Offsets]

_PARTITION_DISCOVERY_INTERVAL_S = 30.0
_ARROW_BATCH_ROWS = 10_000
_PROBE_FETCH_WAIT_MS = 10  # tansu never answers a Fetch with max_wait 0 (kafka-python gets nothing)
_PROBE_PARTITION_FETCH_BYTES = 8 * 1024
_PROBE_MAX_RECORDS = 1_000_000  # drain a probe's fetches at once (records are dropped)
_PROBE_STALL_S = 5.0


def _import_kafka_python() -> None:
    """Import kafka-python once with its import-time DeprecationWarning silenced
    (kafka-python 3 loads its protocol schemas with ``importlib.resources.read_text``,
    which warns on Python 3.11+ and fails test suites that turn warnings into errors)."""
    if "kafka.consumer" in sys.modules:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import kafka  # noqa: F401


# ============================================================================ errors


class KafkaSourceError(LakestepError):
    """Root of the errors the ``lakestep-kafka`` source raises on purpose.

    Plain option misuse raises :class:`ValueError` instead (naming the option).
    """


class KafkaTopicNotFoundError(KafkaSourceError, ValueError):
    """A topic named in ``subscribe`` does not exist on the cluster."""


class KafkaDataLossError(KafkaSourceError):
    """Offsets the query needs are no longer (or not yet) in the log."""


class KafkaSourceTimeoutError(KafkaSourceError, TimeoutError):
    """The broker did not answer, or a partition made no progress, in time."""


# ============================================================================ schema


def kafka_schema(include_headers: bool = False) -> StructType:
    """The Spark schema of the source (Spark's Kafka source schema)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


_HEADERS_ARROW_TYPE = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)
_TIMESTAMP_ARROW_TYPE = pa.timestamp("us", tz="UTC")


def arrow_schema(include_headers: bool = False) -> pa.Schema:
    """The Arrow schema of the record batches ``read()`` yields.

    It must equal what pyspark derives from :func:`kafka_schema` (PySpark checks
    ``Schema.equals`` before accepting a batch).
    """
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", _TIMESTAMP_ARROW_TYPE),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", _HEADERS_ARROW_TYPE))
    return pa.schema(fields)


# ============================================================================ options

_SECRET_KEYS = frozenset({"sasl_plain_password", "ssl_password"})

#: Java-client / librdkafka option names whose kafka-python name is not simply
#: the dotted name with dots replaced by underscores.
_RENAMED: dict[str, str] = {
    "ssl.key.password": "ssl_password",
    "ssl.cipher.suites": "ssl_ciphers",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.crl.location": "ssl_crlfile",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "socket.receive.buffer.bytes": "receive_buffer_bytes",
    "socket.send.buffer.bytes": "send_buffer_bytes",
    "receive.buffer.bytes": "receive_buffer_bytes",
    "send.buffer.bytes": "send_buffer_bytes",
    "max.poll.records": "max_poll_records",
}

_GROUP_KEYS = {
    "group.id",
    "group.instance.id",
    "enable.auto.commit",
    "auto.commit.interval.ms",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "partition.assignment.strategy",
}

#: Options refused with an explanation, by Java/dotted name.
_REFUSED: dict[str, str] = {
    **{
        key: "the source never joins a consumer group nor commits offsets to Kafka "
        "(offsets live in the Spark checkpoint)"
        for key in _GROUP_KEYS
    },
    "auto.offset.reset": "use the startingOffsets option instead",
    "key.deserializer": "key and value are always returned as binary",
    "value.deserializer": "key and value are always returned as binary",
    "allow.auto.create.topics": "the source never creates topics",
    "consumer.timeout.ms": "use kafkaConsumer.pollTimeoutMs instead",
    "ssl.truststore.location": "kafka-python cannot read JKS/PKCS12 stores; convert it to PEM and "
    "pass kafka.ssl.cafile",
    "ssl.truststore.password": "kafka-python cannot read JKS/PKCS12 stores; use kafka.ssl.cafile",
    "ssl.truststore.type": "kafka-python cannot read JKS/PKCS12 stores; use kafka.ssl.cafile",
    "ssl.keystore.location": "kafka-python cannot read JKS/PKCS12 stores; convert it to PEM and "
    "pass kafka.ssl.certfile and kafka.ssl.keyfile",
    "ssl.keystore.password": "kafka-python cannot read JKS/PKCS12 stores; use kafka.ssl.keyfile "
    "and kafka.ssl.password",
    "ssl.keystore.type": "kafka-python cannot read JKS/PKCS12 stores; use kafka.ssl.certfile",
}

#: kafka-python parameters that are not plain values and cannot come from a string option.
_NOT_STRING_SETTABLE = frozenset(
    {
        "kafka_client",
        "selector",
        "socket_options",
        "metric_reporters",
        "default_offset_commit_callback",
        "sasl_oauth_token_provider",
        "ssl_context",
        "partition_assignment_strategy",
    }
)

_INT_WITHOUT_DEFAULT = frozenset({"receive_buffer_bytes", "send_buffer_bytes"})

_JAAS_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule",
    "org.apache.kafka.common.security.scram.ScramLoginModule",
}
_JAAS_RE = re.compile(r"^\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\s+(.*?);?\s*$", re.S)
_JAAS_ARG_RE = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def _parse_bool(option: str, value: str) -> bool:
    lowered = str(value).strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(f"option {option!r} must be true or false, got {value!r}")


def _parse_jaas(value: str) -> dict[str, str]:
    match = _JAAS_RE.match(value)
    if not match or match.group(1) not in _JAAS_MODULES:
        raise ValueError(
            "option 'kafka.sasl.jaas.config' is only understood for PlainLoginModule and "
            "ScramLoginModule (username=\"...\" password=\"...\"); set "
            "kafka.sasl.plain.username / kafka.sasl.plain.password instead"
        )
    args = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _JAAS_ARG_RE.findall(match.group(3))}
    if "username" not in args or "password" not in args:
        raise ValueError(
            "option 'kafka.sasl.jaas.config' must contain username=\"...\" and password=\"...\""
        )
    return {"sasl_plain_username": args["username"], "sasl_plain_password": args["password"]}


def kafka_consumer_config(options: Mapping[str, Any]) -> dict[str, Any]:
    """Map the ``kafka.*`` Spark options to kafka-python ``KafkaConsumer`` keyword args.

    Pure function (no network). Keys are matched case-insensitively; other
    options (not starting with ``kafka.``) are ignored. The mapping:

    * ``kafka.a.b.c`` → ``a_b_c`` when that is a ``KafkaConsumer`` parameter,
      e.g. ``kafka.bootstrap.servers`` → ``bootstrap_servers``,
      ``kafka.security.protocol`` → ``security_protocol``,
      ``kafka.sasl.mechanism`` → ``sasl_mechanism``,
      ``kafka.sasl.plain.username`` → ``sasl_plain_username``,
      ``kafka.ssl.cafile`` → ``ssl_cafile``, ``kafka.request.timeout.ms`` →
      ``request_timeout_ms``, ``kafka.isolation.level`` → ``isolation_level``.
    * Java / librdkafka names with another kafka-python name: ``ssl.key.password``
      → ``ssl_password``, ``ssl.cipher.suites`` → ``ssl_ciphers``,
      ``ssl.ca.location`` / ``ssl.certificate.location`` / ``ssl.key.location`` /
      ``ssl.crl.location`` → ``ssl_cafile`` / ``ssl_certfile`` / ``ssl_keyfile`` /
      ``ssl_crlfile``, ``sasl.username`` / ``sasl.password`` →
      ``sasl_plain_username`` / ``sasl_plain_password``,
      ``[socket.]receive|send.buffer.bytes`` → ``receive|send_buffer_bytes``.
    * ``ssl.endpoint.identification.algorithm`` → ``ssl_check_hostname``
      (``https`` → True, empty → False).
    * ``sasl.jaas.config`` with Kafka's ``PlainLoginModule`` / ``ScramLoginModule``
      → ``sasl_plain_username`` + ``sasl_plain_password``.
    * ``api.version`` ``"2.8.0"`` → ``api_version=(2, 8, 0)``.

    Values are converted to the type of kafka-python's default (int, bool).

    Raises:
        ValueError: naming the option, for unknown names, consumer-group settings
            (``group.id``, ``enable.auto.commit``...), ``auto.offset.reset``,
            deserializers, JKS key/trust stores, unparsable values, or a missing
            ``kafka.bootstrap.servers``. Secret values never appear in messages.
    """
    _import_kafka_python()
    from kafka import KafkaConsumer

    defaults = KafkaConsumer.DEFAULT_CONFIG
    config: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def put(key: str, value: Any, option: str) -> None:
        if key in config and sources[key] != option:
            raise ValueError(f"options {sources[key]!r} and {option!r} both set kafka-python {key!r}")
        config[key] = value
        sources[key] = option

    for raw_key, raw_value in options.items():
        option = str(raw_key)
        lowered = option.lower()
        if not lowered.startswith("kafka."):
            continue
        name = lowered[len("kafka.") :]
        value = "" if raw_value is None else str(raw_value)
        if name in _REFUSED:
            raise ValueError(f"option {option!r} is not supported: {_REFUSED[name]}")
        if name == "sasl.jaas.config":
            for key, val in _parse_jaas(value).items():
                put(key, val, option)
            continue
        if name == "ssl.endpoint.identification.algorithm":
            put("ssl_check_hostname", value.strip().lower() == "https", option)
            continue
        key = _RENAMED.get(name, name.replace(".", "_").replace("-", "_"))
        if key not in defaults:
            raise ValueError(
                f"option {option!r} is not a kafka-python KafkaConsumer setting "
                f"(it maps to {key!r}); see lakestep.streaming.kafka.kafka_consumer_config"
            )
        if key in _NOT_STRING_SETTABLE or key in {
            "group_id",
            "group_instance_id",
            "enable_auto_commit",
            "auto_offset_reset",
            "key_deserializer",
            "value_deserializer",
            "allow_auto_create_topics",
            "consumer_timeout_ms",
        } | {k.replace(".", "_") for k in _GROUP_KEYS}:
            raise ValueError(f"option {option!r} ({key}) cannot be set on this source")
        default = defaults[key]
        shown = "***" if key in _SECRET_KEYS else repr(value)
        try:
            converted: Any
            if isinstance(default, bool):
                converted = _parse_bool(option, value)
            elif isinstance(default, int) or key in _INT_WITHOUT_DEFAULT:
                converted = int(value.strip())
            elif key == "api_version":
                converted = tuple(int(part) for part in value.strip().split("."))
            else:
                converted = value
        except ValueError as exc:
            raise ValueError(f"option {option!r} has an invalid value {shown}: {exc}") from None
        put(key, converted, option)

    servers = str(config.get("bootstrap_servers", "")).strip()
    if not servers:
        raise ValueError("option 'kafka.bootstrap.servers' is required (comma-separated host:port)")
    config["bootstrap_servers"] = [s.strip() for s in servers.split(",") if s.strip()]
    return config


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with secrets replaced by ``***`` (for logs)."""
    return {k: ("***" if k in _SECRET_KEYS and v is not None else v) for k, v in config.items()}


def parse_starting_offsets(value: str | None, topics: Sequence[str]) -> StartingOffsets:
    """Parse ``startingOffsets``: ``earliest``, ``latest`` or Spark's JSON form.

    JSON partitions are not checked against the cluster here (that happens when
    the query starts: every partition of the subscribed topics must be listed).

    Raises:
        ValueError: naming ``startingOffsets``.
    """
    if value is None or not str(value).strip():
        return "latest"
    text = str(value).strip()
    if text.lower() in ("earliest", "latest"):
        return "earliest" if text.lower() == "earliest" else "latest"
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(
            f"option 'startingOffsets' must be 'earliest', 'latest' or JSON like "
            f'{{"topic": {{"0": 23, "1": -2}}}}, got {text!r}'
        ) from None
    if not isinstance(parsed, dict) or not parsed:
        raise ValueError("option 'startingOffsets' JSON must be a non-empty object of topics")
    result: Offsets = {}
    for topic, parts in parsed.items():
        if topic not in topics:
            raise ValueError(
                f"option 'startingOffsets' names topic {topic!r}, which is not subscribed "
                f"(subscribe={','.join(topics)!r})"
            )
        if not isinstance(parts, dict) or not parts:
            raise ValueError(
                f"option 'startingOffsets': topic {topic!r} needs an object of partition: offset"
            )
        for part, offset in parts.items():
            try:
                partition = int(part)
            except (TypeError, ValueError):
                raise ValueError(
                    f"option 'startingOffsets': partition {part!r} of topic {topic!r} is not "
                    "an integer"
                ) from None
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise ValueError(
                    f"option 'startingOffsets': offset {offset!r} of {topic}-{partition} must "
                    "be an integer >= 0, or -2 (earliest) / -1 (latest)"
                )
            if partition < 0:
                raise ValueError(f"option 'startingOffsets': negative partition {partition}")
            result[(topic, partition)] = offset
    return result


def _positive_int(options: Mapping[str, Any], name: str, default: int | None) -> int | None:
    raw = options.get(name.lower())
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {name!r} must be a positive integer, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"option {name!r} must be a positive integer, got {raw!r}")
    return value


_KNOWN_OPTIONS = {
    "subscribe",
    "startingoffsets",
    "maxoffsetspertrigger",
    "includeheaders",
    "failondataloss",
    "kafkaconsumer.polltimeoutms",
    "fetchoffset.timeoutms",
    "rowformat",
    "path",
}
_UNSUPPORTED_OPTIONS = {
    "assign": "only 'subscribe' is supported",
    "subscribepattern": "only 'subscribe' is supported",
    "endingoffsets": "it is not valid for streaming queries",
    "endingoffsetsbytimestamp": "it is not valid for streaming queries",
    "startingoffsetsbytimestamp": "use startingOffsets",
    "startingtimestamp": "use startingOffsets",
    "minpartitions": "there is always one Spark partition per Kafka partition",
    "maxpartitions": "there is always one Spark partition per Kafka partition",
    "minoffsetspertrigger": "it is not implemented",
    "groupidprefix": "the source does not use consumer groups",
}


@dataclass(frozen=True)
class KafkaSourceOptions:
    """Validated source options (see the module docstring)."""

    topics: tuple[str, ...]
    consumer_config: dict[str, Any] = field(repr=False)
    starting_offsets: StartingOffsets = "latest"
    max_offsets_per_trigger: int | None = None
    include_headers: bool = False
    poll_timeout_ms: int = 120_000
    fetch_offset_timeout_ms: int = 60_000
    row_format: Literal["arrow", "tuples"] = "arrow"

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> KafkaSourceOptions:
        """Validate Spark's (case-insensitive) option map.

        Raises:
            ValueError: naming the offending option.
        """
        opts = {str(k).lower(): v for k, v in options.items()}
        consumer_config = kafka_consumer_config(opts)
        for name, why in _UNSUPPORTED_OPTIONS.items():
            if name in opts:
                raise ValueError(f"option {name!r} is not supported by {FORMAT_NAME}: {why}")
        unknown = sorted(k for k in opts if not k.startswith("kafka.") and k not in _KNOWN_OPTIONS)
        if unknown:
            logger.warning("%s ignores unknown options %s", FORMAT_NAME, unknown)

        subscribe = str(opts.get("subscribe") or "")
        topics = tuple(dict.fromkeys(t.strip() for t in subscribe.split(",") if t.strip()))
        if not topics:
            raise ValueError("option 'subscribe' is required (comma-separated topic names)")

        fail_on_data_loss = _parse_bool("failOnDataLoss", str(opts.get("failondataloss", "true")))
        if not fail_on_data_loss:
            raise ValueError(
                "option 'failOnDataLoss'=false is not supported: lost offsets always fail the query"
            )
        row_format = str(opts.get("rowformat", "arrow")).strip().lower()
        if row_format not in ("arrow", "tuples"):
            raise ValueError(f"option 'rowFormat' must be 'arrow' or 'tuples', got {row_format!r}")

        return cls(
            topics=topics,
            consumer_config=consumer_config,
            starting_offsets=parse_starting_offsets(opts.get("startingoffsets"), topics),
            max_offsets_per_trigger=_positive_int(opts, "maxOffsetsPerTrigger", None),
            include_headers=_parse_bool("includeHeaders", str(opts.get("includeheaders", "false"))),
            poll_timeout_ms=_positive_int(opts, "kafkaConsumer.pollTimeoutMs", 120_000) or 120_000,
            fetch_offset_timeout_ms=_positive_int(opts, "fetchOffset.timeoutMs", 60_000) or 60_000,
            row_format="arrow" if row_format == "arrow" else "tuples",
        )


# ============================================================================ offsets


def offsets_to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """Canonical offset dict for Spark: topics and partitions sorted, partition keys as str.

    Spark compares offsets by their JSON text, so the order must be stable.
    """
    result: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        result.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return result


def offsets_from_json(data: Mapping[str, Mapping[str, Any]] | None) -> Offsets:
    """Inverse of :func:`offsets_to_json`."""
    result: Offsets = {}
    for topic, parts in (data or {}).items():
        for partition, offset in parts.items():
            result[(topic, int(partition))] = int(offset)
    return result


def rate_limit(start: Mapping[TP, int], until: Mapping[TP, int], limit: int) -> Offsets:
    """Spark's ``maxOffsetsPerTrigger`` split of ``limit`` records over partitions.

    Each partition with a backlog gets ``limit * backlog / total_backlog``
    records, rounded down, except that shares below one record are rounded up
    so that small partitions are not starved (the total can therefore exceed
    ``limit`` by at most the number of partitions). ``start`` must contain every
    key of ``until``.
    """
    sizes = {tp: end - start[tp] for tp, end in until.items() if end - start[tp] > 0}
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(until)
    result: Offsets = {}
    for tp, end in until.items():
        size = sizes.get(tp)
        if size is None:
            result[tp] = end
            continue
        prorate = limit * (size / total)
        share = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        result[tp] = min(end, start[tp] + int(share))
    return result


# ============================================================================ kafka access


def _consumer(config: Mapping[str, Any], *, timeout_ms: int, **overrides: Any) -> KafkaConsumer:
    """A group-less, non-committing kafka-python consumer.

    ``timeout_ms`` bounds the initial bootstrap (connection + metadata) unless
    the user set ``kafka.bootstrap.timeout.ms``.
    """
    _import_kafka_python()
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError

    settings = dict(config)
    settings.update(overrides)
    settings.setdefault("bootstrap_timeout_ms", min(30_000, timeout_ms))
    settings.update(
        group_id=None,
        enable_auto_commit=False,
        allow_auto_create_topics=False,
        auto_offset_reset="none",  # never move silently: out-of-range is data loss
    )
    try:
        return KafkaConsumer(**settings)
    except KafkaError as exc:
        raise KafkaSourceTimeoutError(
            f"cannot connect to Kafka at {','.join(settings['bootstrap_servers'])}: {exc!r}"
        ) from exc


class _ProbeStalled(Exception):
    """A high-watermark probe got no answer in time (internal)."""


class _OffsetClient:
    """Driver-side metadata and offset lookups.

    Holds two kafka-python consumers for the life of the stream reader: one for
    metadata and ListOffsets(earliest), one for high-watermark probes (see
    :meth:`high_watermarks`), so an idle query does not open a connection (and
    a TLS/SASL handshake) per trigger.
    """

    def __init__(self, config: Mapping[str, Any], timeout_ms: int) -> None:
        self._config = dict(config)
        self._timeout_ms = timeout_ms
        self._consumer = _consumer(config, timeout_ms=timeout_ms)
        self._probe: KafkaConsumer | None = None
        self._partitions: dict[str, list[int]] = {}
        self._refreshed_at = -math.inf

    def close(self) -> None:
        for consumer in (self._probe, self._consumer):
            if consumer is None:
                continue
            try:
                consumer.close(autocommit=False, timeout_ms=2000)
            except Exception:  # closing is best effort
                logger.debug("closing a driver consumer failed", exc_info=True)
        self._probe = None

    def partitions(self, topics: Sequence[str], *, force: bool = False) -> list[TP]:
        """All partitions of ``topics``; metadata is refreshed at most every 30 s
        unless ``force``.

        Raises:
            KafkaTopicNotFoundError: a topic does not exist (after ~1 s of retries).
        """
        stale = time.monotonic() - self._refreshed_at > _PARTITION_DISCOVERY_INTERVAL_S
        if force or stale or any(t not in self._partitions for t in topics):
            deadline = time.monotonic() + 1.0
            while True:
                self._consumer.topics()  # forces a Metadata round trip
                found = {t: sorted(self._consumer.partitions_for_topic(t) or ()) for t in topics}
                missing = [t for t, parts in found.items() if not parts]
                if not missing or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if missing:
                raise KafkaTopicNotFoundError(
                    f"option 'subscribe': topic(s) {', '.join(map(repr, missing))} do not exist "
                    f"on {','.join(self._consumer.config['bootstrap_servers'])}"
                )
            for topic, parts in found.items():
                known = self._partitions.get(topic)
                if known is not None and len(parts) > len(known):
                    logger.info("topic %r grew from %d to %d partitions", topic, len(known), len(parts))
                self._partitions[topic] = parts
            self._refreshed_at = time.monotonic()
        return [(t, p) for t in topics for p in self._partitions[t]]

    def earliest(self, tps: Sequence[TP]) -> Offsets:
        """Log start offsets (ListOffsets earliest)."""
        if not tps:
            return {}
        _import_kafka_python()
        from kafka import TopicPartition
        from kafka.errors import KafkaTimeoutError

        try:
            found = self._consumer.beginning_offsets(
                [TopicPartition(t, p) for t, p in tps], timeout_ms=self._timeout_ms
            )
        except KafkaTimeoutError as exc:
            raise KafkaSourceTimeoutError(
                f"no earliest offsets for {sorted(tps)} within {self._timeout_ms} ms"
            ) from exc
        return {(tp.topic, tp.partition): int(off) for tp, off in found.items()}

    def high_watermarks(self, positions: Mapping[TP, int]) -> Offsets:
        """The high watermark of each partition, read from a Fetch response.

        ``positions`` must be offsets in the log or equal to its end; the fetch
        starts there and the records it returns are decoded and dropped, so
        passing the last known end keeps a probe cheap (it then only carries
        what was appended since). ListOffsets(latest) is not used on purpose,
        see the module docstring.

        A returned value is never above the true high watermark and never below
        the given position. It can lag by the few milliseconds between a fetch
        and this call (a response to a fetch sent by the previous probe from
        the same position may be used).

        Raises:
            KafkaDataLossError: a position is beyond the end of the log.
            KafkaSourceTimeoutError: no answer within ``fetchOffset.timeoutMs``.
        """
        if not positions:
            return {}
        deadline = time.monotonic() + self._timeout_ms / 1000
        for attempt in (1, 2):
            if self._probe is None:
                self._probe = _consumer(
                    self._config,
                    timeout_ms=self._timeout_ms,
                    fetch_max_wait_ms=_PROBE_FETCH_WAIT_MS,
                    max_partition_fetch_bytes=_PROBE_PARTITION_FETCH_BYTES,
                    fetch_min_bytes=1,
                    # KIP-227 incremental fetch sessions leave partitions whose state
                    # did not change out of the response: a re-probe would never see
                    # their high watermark. Full Fetch requests answer for all.
                    enable_incremental_fetch_sessions=False,
                )
            # The first attempt gets a short leash: a healthy broker answers in
            # milliseconds, and a wedged consumer is replaced by a fresh one.
            until = min(deadline, time.monotonic() + _PROBE_STALL_S) if attempt == 1 else deadline
            try:
                return self._probe_once(self._probe, positions, until)
            except _ProbeStalled as stalled:
                probe, self._probe = self._probe, None
                try:
                    probe.close(autocommit=False, timeout_ms=1000)
                except Exception:
                    logger.debug("closing a stalled probe consumer failed", exc_info=True)
                if attempt == 2 or time.monotonic() >= deadline:
                    raise KafkaSourceTimeoutError(
                        f"no Fetch response with a high watermark for {stalled.args[0]} within "
                        f"{self._timeout_ms} ms (option fetchOffset.timeoutMs)"
                    ) from None
                logger.warning(
                    "high-watermark probe stalled on %s; retrying with a new consumer", stalled.args[0]
                )
        raise AssertionError("unreachable")

    def _probe_once(self, consumer: KafkaConsumer, positions: Mapping[TP, int], until: float) -> Offsets:
        _import_kafka_python()
        from kafka import TopicPartition
        from kafka.errors import OffsetOutOfRangeError

        wanted = {TopicPartition(t, p): off for (t, p), off in positions.items()}
        result: Offsets = {}
        pending = set(wanted)
        # Never pause() partitions here: kafka-python parks the buffered data of
        # paused partitions and, after unsubscribe()/assign(), may then never
        # fetch them again.
        consumer.assign(list(wanted))  # assignment is empty: fresh state, highwater() is None
        try:
            for tp, off in wanted.items():
                consumer.seek(tp, off)
            while pending:
                try:
                    consumer.poll(timeout_ms=_PROBE_FETCH_WAIT_MS, max_records=_PROBE_MAX_RECORDS)
                except OffsetOutOfRangeError as exc:
                    self._handle_out_of_range(consumer, exc, wanted)
                for tp in list(pending):
                    hw = consumer.highwater(tp)
                    if hw is not None:
                        result[(tp.topic, tp.partition)] = int(hw)
                        pending.discard(tp)
                if pending and time.monotonic() > until:
                    raise _ProbeStalled(sorted((tp.topic, tp.partition) for tp in pending))
        finally:
            consumer.unsubscribe()
        return result

    def _handle_out_of_range(
        self, consumer: KafkaConsumer, exc: Exception, wanted: dict[TopicPartition, int]
    ) -> None:
        bad = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
        if not bad:
            raise KafkaDataLossError(f"offset out of range while probing: {exc!r}") from exc
        earliest = self.earliest([(tp.topic, tp.partition) for tp in bad])
        for tp, off in bad.items():
            start = earliest[(tp.topic, tp.partition)]
            if off < start:  # deleted by retention: the end is still after it
                consumer.seek(tp, start)
                wanted[tp] = start
            else:
                raise KafkaDataLossError(
                    f"{tp.topic}-{tp.partition}: offset {off} is beyond the end of the log; the "
                    "topic was deleted and recreated, or the broker lost data"
                ) from exc


# ============================================================================ reading

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _records_to_batch(
    records: Sequence[Any], topic: str, partition: int, include_headers: bool
) -> pa.RecordBatch:
    """Kafka-python ``ConsumerRecord`` namedtuples to one Arrow batch of :func:`arrow_schema`."""
    n = len(records)
    # ConsumerRecord is a namedtuple: transpose once (in C), then pick columns by name.
    index = {name: i for i, name in enumerate(records[0]._fields)}
    columns = list(zip(*records))

    def column(name: str) -> tuple[Any, ...]:
        return columns[index[name]]

    arrays: list[pa.Array] = [
        pa.array(column("key"), pa.binary()),
        pa.array(column("value"), pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array(column("offset"), pa.int64()),
        pc.multiply(pa.array(column("timestamp"), pa.int64()), 1000).cast(_TIMESTAMP_ARROW_TYPE),
        pa.array(column("timestamp_type"), pa.int32()),
    ]
    if include_headers:
        arrays.append(
            pa.array(
                [[{"key": k, "value": v} for k, v in (h or ())] for h in column("headers")],
                _HEADERS_ARROW_TYPE,
            )
        )
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers))


def _record_to_tuple(r: Any, include_headers: bool) -> tuple[Any, ...]:
    row = (
        r.key,
        r.value,
        r.topic,
        r.partition,
        r.offset,
        _EPOCH + timedelta(milliseconds=r.timestamp),
        r.timestamp_type,
    )
    if include_headers:
        return (*row, [(k, v) for k, v in (r.headers or ())])
    return row


def read_partition_range(
    options: KafkaSourceOptions, topic: str, partition: int, start: int, end: int
) -> Iterator[pa.RecordBatch] | Iterator[tuple[Any, ...]]:
    """Read exactly the offsets ``[start, end)`` of one partition, then stop.

    Yields Arrow record batches (``rowFormat=arrow``) or tuples. Offsets missing
    inside the range (compaction, transaction markers) are skipped; records
    outside it are dropped.

    Raises:
        KafkaSourceTimeoutError: no progress for ``kafkaConsumer.pollTimeoutMs``.
        KafkaDataLossError: ``start`` is no longer (or ``end`` not yet) in the log.
    """
    _import_kafka_python()
    from kafka import TopicPartition
    from kafka.errors import OffsetOutOfRangeError

    if end <= start:
        return
    tp = TopicPartition(topic, partition)
    consumer = _consumer(options.consumer_config, timeout_ms=options.poll_timeout_ms)
    arrow = options.row_format == "arrow"
    headers = options.include_headers
    timeout_s = options.poll_timeout_ms / 1000
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        position = start
        pending: list[Any] = []
        last_progress = time.monotonic()
        while position < end:
            try:
                polled = consumer.poll(timeout_ms=200, max_records=_ARROW_BATCH_ROWS)
            except OffsetOutOfRangeError as exc:
                raise KafkaDataLossError(
                    f"{topic}-{partition}: offsets [{position}, {end}) are not in the log any "
                    "more (retention, topic recreated, or broker data loss)"
                ) from exc
            records = polled.get(tp, ())
            if records and (records[0].offset < position or records[-1].offset >= end):
                records = [r for r in records if position <= r.offset < end]
            new_position = max(position, consumer.position(tp))
            if records:
                new_position = max(new_position, records[-1].offset + 1)
            if new_position > position:
                position = new_position
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > timeout_s:
                raise KafkaSourceTimeoutError(
                    f"{topic}-{partition}: stuck at offset {position} of [{start}, {end}) for "
                    f"{options.poll_timeout_ms} ms (high watermark {consumer.highwater(tp)}; "
                    "option kafkaConsumer.pollTimeoutMs)"
                )
            if not records:
                continue
            if arrow:
                pending.extend(records)
                if len(pending) >= _ARROW_BATCH_ROWS:
                    yield _records_to_batch(pending, topic, partition, headers)
                    pending = []
            else:
                for record in records:
                    yield _record_to_tuple(record, headers)
        if pending:
            yield _records_to_batch(pending, topic, partition, headers)
    finally:
        consumer.close(autocommit=False, timeout_ms=2000)


# ============================================================================ spark


@dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    """The offsets ``[start, end)`` of one Kafka partition: one Spark task."""

    topic: str
    partition: int
    start: int
    end: int


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver; reads partitions on executors.

    On the driver (Spark's long-lived Python process for the query) it keeps
    two kafka-python consumers, created lazily and never pickled: one for
    metadata, one for high-watermark probes. ``read()`` runs in executors and
    opens its own consumer per task.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self._client: _OffsetClient | None = None
        self._known_end: Offsets = {}
        self._target: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    # ---------------------------------------------------------------- driver

    @property
    def client(self) -> _OffsetClient:
        if self._client is None:
            logger.debug("connecting with %s", redact(self.options.consumer_config))
            self._client = _OffsetClient(self.options.consumer_config, self.options.fetch_offset_timeout_ms)
        return self._client

    def _ends(self, start: Mapping[TP, int]) -> Offsets:
        """High watermarks of the partitions in ``start``, probed from the furthest
        offset known to be in the log."""
        probe_from = {tp: max(off, self._known_end.get(tp, off)) for tp, off in start.items()}
        ends = self.client.high_watermarks(probe_from)
        self._known_end.update(ends)
        return ends

    def initialOffset(self) -> dict[str, dict[str, int]]:
        """Resolve ``startingOffsets`` against the cluster."""
        tps = self.client.partitions(self.options.topics, force=True)
        starting = self.options.starting_offsets
        earliest = self.client.earliest(tps)
        if starting == "earliest":
            result = earliest
        elif starting == "latest":
            result = self._ends(earliest)
        else:
            assert isinstance(starting, dict)
            missing = sorted(set(tps) - set(starting))
            extra = sorted(set(starting) - set(tps))
            if missing or extra:
                raise ValueError(
                    "option 'startingOffsets' must list every partition of the subscribed topics "
                    f"(use -2 for earliest, -1 for latest); missing {missing}, unknown {extra}"
                )
            latest = self._ends(earliest) if LATEST in starting.values() else {}
            result = {}
            for tp in tps:
                offset = starting[tp]
                if offset == EARLIEST:
                    result[tp] = earliest[tp]
                elif offset == LATEST:
                    result[tp] = latest[tp]
                else:
                    result[tp] = offset
        logger.info("initial offsets %s", offsets_to_json(result))
        return offsets_to_json(result)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Freeze the end of every current partition: an availableNow query reads
        up to here and stops."""
        tps = self.client.partitions(self.options.topics, force=True)
        self._target = self._ends(self.client.earliest(tps))
        logger.info("availableNow target offsets %s", offsets_to_json(self._target))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        """End offsets of the next micro-batch (``start`` if there is nothing new)."""
        begin = offsets_from_json(start)
        tps = self.client.partitions(self.options.topics)
        new = [tp for tp in tps if tp not in begin]
        if self._target is not None:
            new = [tp for tp in new if tp in self._target]
        origin = dict(begin)
        origin.update(self.client.earliest(new))
        ends = self._ends({tp: origin[tp] for tp in tps if tp in origin})
        until: Offsets = {}
        for tp, offset in origin.items():
            end = ends.get(tp)
            if end is None:  # not subscribed any more, or gone from metadata: hold it
                if tp[0] in self.options.topics:
                    logger.warning("partition %s-%d is missing from the topic metadata", *tp)
                until[tp] = offset
                continue
            if end < offset:
                raise KafkaDataLossError(
                    f"{tp[0]}-{tp[1]}: the log ends at {end} but the query already read up to "
                    f"{offset}; the topic was recreated or the broker lost data"
                )
            if self._target is not None:
                end = max(offset, min(end, self._target.get(tp, offset)))
            until[tp] = end
        if isinstance(limit, ReadMaxRows):
            until = rate_limit(origin, until, limit.max_rows)
        return offsets_to_json(until)

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return offsets_to_json(self._known_end) if self._known_end else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One input partition per Kafka partition with offsets in ``[start, end)``."""
        begin = offsets_from_json(start)
        until = offsets_from_json(end)
        new = [tp for tp in until if tp not in begin]
        if new:
            begin.update(self.client.earliest(new))
        result: list[InputPartition] = []
        for tp in sorted(until):
            first, stop = begin[tp], until[tp]
            if stop < first:
                raise KafkaDataLossError(
                    f"{tp[0]}-{tp[1]}: batch end {stop} is before its start {first}"
                )
            if stop > first:
                result.append(KafkaInputPartition(tp[0], tp[1], first, stop))
        return result

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: progress lives in Spark's checkpoint only."""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # ---------------------------------------------------------------- executor

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch] | Iterator[tuple[Any, ...]]:
        assert isinstance(partition, KafkaInputPartition), partition
        return read_partition_range(
            self.options, partition.topic, partition.partition, partition.start, partition.end
        )


class KafkaDataSource(DataSource):
    """The ``lakestep-kafka`` data source (streaming reads only)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def _options(self) -> KafkaSourceOptions:
        return KafkaSourceOptions.from_options(self.options)

    def schema(self) -> StructType:
        return kafka_schema(self._options().include_headers)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = self._options()
        expected = kafka_schema(options.include_headers)
        if schema != expected:
            raise ValueError(
                f"{FORMAT_NAME} has a fixed schema and does not accept a user-specified one; "
                f"expected {expected.simpleString()}, got {schema.simpleString()}"
            )
        return KafkaStreamReader(options)


def register_kafka_source(spark: SparkSession) -> None:
    """Register ``lakestep-kafka`` with ``spark`` (idempotent)."""
    spark.dataSource.register(KafkaDataSource)
