"""Bad options get a typed error naming the option (issue 33; the catalog's own bad input is
tests/catalog/test_bad_input.py).

Two tables of cases, in that file's style: the options, the :class:`LakestepError` subclass
they must raise (a ``ValueError`` too: the contract of option misuse), and a fragment of the
message; every message must also name the option it is about.

* ``lakestep-kafka``: :meth:`KafkaSourceOptions.from_options` (streaming queries and batch
  reads) and :func:`check_common_options` (what the data source's ``schema()`` checks), the
  parse entry points of lakestep/streaming/kafka/options.py. The error is
  :class:`KafkaOptionError`, whose ``option`` attribute names the option too.
* ``lakestep``: the data source itself (:class:`LakestepDataSource`) makes its batch reader
  and writer, streaming source and sink from the options, as Spark does at ``load()`` /
  ``start()``. The cases that get past the options' form read a table of a real catalog, on
  SQLite and PostgreSQL.

No Spark session, no JVM: pyspark is imported for its data source classes only. The options
are handed over as Spark does, in a :class:`CaseInsensitiveDict` (its keys lowercased).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import pyarrow as pa
import pytest
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.types import LongType, StringType, StructField, StructType

from lakestep import Catalog, errors
from lakestep.streaming.datasource import LakestepDataSource
from lakestep.streaming.kafka import KafkaOptionError, KafkaSourceError
from lakestep.streaming.kafka.options import KafkaSourceOptions, check_common_options

# ------------------------------------------------------------------ lakestep-kafka
KAFKA_BASE = {"kafka.bootstrap.servers": "a:1", "subscribe": "t"}
SECRET = "hunter2"  # a password: never in a message
PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"


@dataclass(frozen=True)
class KafkaCase:
    name: str
    options: Mapping[str, str | None]  # over KAFKA_BASE; None removes a key
    option: str | None  # KafkaOptionError.option: the option at fault (None: no one option)
    fragment: str  # in the message
    entry: str = "stream"  # "stream" | "batch": from_options; "common": check_common_options


def k(name: str, options: Mapping[str, str | None], option: str | None, fragment: str,
      entry: str = "stream") -> KafkaCase:
    return KafkaCase(name, options, option, fragment, entry)


KAFKA_CASES = [
    # kafka.*: the consumer's settings
    k("bootstrap-missing", {"kafka.bootstrap.servers": None}, "kafka.bootstrap.servers", "is required"),
    k("bootstrap-empty", {"kafka.bootstrap.servers": " "}, "kafka.bootstrap.servers", "is required"),
    # was accepted: an empty list of servers
    k("bootstrap-only-commas", {"kafka.bootstrap.servers": " , ,"}, "kafka.bootstrap.servers", "is required"),
    k("group-instance-id", {"kafka.group.instance.id": "g"}, "kafka.group.instance.id", "never joins a consumer group"),
    k("enable-auto-commit", {"kafka.enable.auto.commit": "true"}, "kafka.enable.auto.commit", "consumer group"),
    k("session-timeout", {"kafka.session.timeout.ms": "10000"}, "kafka.session.timeout.ms", "consumer group"),
    k("auto-offset-reset", {"kafka.auto.offset.reset": "earliest"}, "kafka.auto.offset.reset", "startingOffsets"),
    k("key-deserializer", {"kafka.key.deserializer": "x.Y"}, "kafka.key.deserializer", "binary"),
    k("value-deserializer", {"kafka.value.deserializer": "x.Y"}, "kafka.value.deserializer", "binary"),
    k("allow-auto-create-topics", {"kafka.allow.auto.create.topics": "true"}, "kafka.allow.auto.create.topics",
      "never creates topics"),
    k("consumer-timeout", {"kafka.consumer.timeout.ms": "5"}, "kafka.consumer.timeout.ms", "pollTimeoutMs"),
    k("truststore-location", {"kafka.ssl.truststore.location": "/t.jks"}, "kafka.ssl.truststore.location", "PEM"),
    k("truststore-password", {"kafka.ssl.truststore.password": SECRET}, "kafka.ssl.truststore.password", "JKS"),
    k("keystore-location", {"kafka.ssl.keystore.location": "/k.jks"}, "kafka.ssl.keystore.location", "PEM"),
    k("keystore-type", {"kafka.ssl.keystore.type": "PKCS12"}, "kafka.ssl.keystore.type", "JKS"),
    k("unknown-setting", {"kafka.no.such.setting": "1"}, "kafka.no.such.setting",
      "not a kafka-python KafkaConsumer setting"),
    k("not-string-settable-selector", {"kafka.selector": "x"}, "kafka.selector", "cannot be set"),
    k("not-string-settable-ssl-context", {"kafka.ssl.context": "x"}, "kafka.ssl.context", "cannot be set"),
    k("group-setting-by-its-python-name", {"kafka.enable_auto_commit": "false"}, "kafka.enable_auto_commit",
      "cannot be set"),
    k("int-setting-not-a-number", {"kafka.request.timeout.ms": "soon"}, "kafka.request.timeout.ms", "invalid value"),
    k("buffer-bytes-not-a-number", {"kafka.receive.buffer.bytes": "big"}, "kafka.receive.buffer.bytes",
      "invalid value"),
    k("bool-setting-not-a-bool", {"kafka.check.crcs": "perhaps"}, "kafka.check.crcs", "true or false"),
    k("api-version-not-a-version", {"kafka.api.version": "2.x"}, "kafka.api.version", "invalid value"),
    k("password-set-twice", {"kafka.sasl.plain.password": SECRET, "kafka.sasl.password": "other-" + SECRET},
      "kafka.sasl.password", "both set"),
    k("jaas-kerberos", {"kafka.sasl.jaas.config": "com.sun.security.auth.module.Krb5LoginModule required;"},
      "kafka.sasl.jaas.config", "PlainLoginModule"),
    k("jaas-no-password", {"kafka.sasl.jaas.config": f'{PLAIN} required username="u";'},
      "kafka.sasl.jaas.config", 'password="..."'),
    # was accepted, and checked no host name: ldaps is no value kafka-python has
    k("endpoint-identification-ldaps", {"kafka.ssl.endpoint.identification.algorithm": "ldaps"},
      "kafka.ssl.endpoint.identification.algorithm", "must be 'https'"),
    # what to read
    k("no-subscription", {"subscribe": None}, None, "exactly one of the options 'subscribe'"),
    k("two-subscriptions", {"assign": '{"t": [0]}'}, None, "got subscribe, assign"),
    k("subscribe-only-commas", {"subscribe": " , "}, "subscribe", "comma-separated topic names"),
    k("subscribe-pattern-invalid", {"subscribe": None, "subscribePattern": "t("}, "subscribePattern",
      "not a valid regular expression"),
    k("assign-not-json", {"subscribe": None, "assign": "t:0"}, "assign", "must be JSON like"),
    k("assign-partition-not-a-list", {"subscribe": None, "assign": '{"t": 0}'}, "assign", "must be JSON like"),
    k("assign-negative-partition", {"subscribe": None, "assign": '{"t": [-1]}'}, "assign", "must be JSON like"),
    k("assign-bool-partition", {"subscribe": None, "assign": '{"t": [true]}'}, "assign", "must be JSON like"),
    # where to start and end
    k("starting-offsets-word", {"startingOffsets": "yesterday"}, "startingOffsets", "'earliest', 'latest' or JSON"),
    k("starting-offsets-empty-json", {"startingOffsets": "{}"}, "startingOffsets", "non-empty object of topics"),
    k("starting-offsets-list", {"startingOffsets": "[1]"}, "startingOffsets", "non-empty object of topics"),
    k("starting-offsets-other-topic", {"startingOffsets": '{"u": {"0": 1}}'}, "startingOffsets", "not subscribed"),
    k("starting-offsets-no-partitions", {"startingOffsets": '{"t": [0]}'}, "startingOffsets",
      "object of partition: offset"),
    k("starting-offsets-partition-word", {"startingOffsets": '{"t": {"x": 1}}'}, "startingOffsets",
      "not an integer"),
    k("starting-offsets-negative-partition", {"startingOffsets": '{"t": {"-1": 0}}'}, "startingOffsets",
      "negative partition"),
    k("starting-offsets-below-earliest", {"startingOffsets": '{"t": {"0": -3}}'}, "startingOffsets",
      "must be an integer >= 0"),
    k("starting-offsets-offset-string", {"startingOffsets": '{"t": {"0": "1"}}'}, "startingOffsets",
      "must be an integer >= 0"),
    k("starting-offsets-offset-bool", {"startingOffsets": '{"t": {"0": true}}'}, "startingOffsets",
      "must be an integer >= 0"),
    k("batch-starting-latest", {"startingOffsets": "latest"}, "startingOffsets", "cannot be latest", "batch"),
    k("batch-starting-offset-latest", {"startingOffsets": '{"t": {"0": -1}}'}, "startingOffsets",
      "cannot be latest", "batch"),
    k("batch-ending-earliest", {"endingOffsets": "earliest"}, "endingOffsets", "cannot be earliest", "batch"),
    k("batch-ending-offset-earliest", {"endingOffsets": '{"t": {"0": -2}}'}, "endingOffsets",
      "cannot be earliest", "batch"),
    k("batch-ending-word", {"endingOffsets": "soon"}, "endingOffsets", "'earliest', 'latest' or JSON", "batch"),
    # the option was named lowercased ('endingoffsets', as Spark hands it over)
    k("streaming-ending-offsets", {"endingOffsets": "latest"}, "endingOffsets", "not valid for streaming queries"),
    k("streaming-ending-timestamp", {"endingTimestamp": "1"}, "endingTimestamp", "not valid for streaming queries"),
    k("streaming-ending-offsets-by-timestamp", {"endingOffsetsByTimestamp": '{"t": {"0": 1}}'},
      "endingOffsetsByTimestamp", "not valid for streaming queries"),
    k("max-partitions", {"maxPartitions": "3"}, "maxPartitions", "use minPartitions"),
    k("starting-timestamp-negative", {"startingTimestamp": "-1"}, "startingTimestamp", "milliseconds since the epoch"),
    k("starting-timestamp-word", {"startingTimestamp": "yesterday"}, "startingTimestamp",
      "milliseconds since the epoch"),
    k("starting-offsets-by-timestamp-negative", {"startingOffsetsByTimestamp": '{"t": {"0": -2}}'},
      "startingOffsetsByTimestamp", "ms since the epoch"),
    # was "must be 'earliest', 'latest' or JSON": neither word is a timestamp
    k("starting-offsets-by-timestamp-word", {"startingOffsetsByTimestamp": "earliest"}, "startingOffsetsByTimestamp",
      "ms since the epoch"),
    k("starting-offsets-by-timestamp-not-json", {"startingOffsetsByTimestamp": "{"}, "startingOffsetsByTimestamp",
      "ms since the epoch"),
    k("starting-offsets-by-timestamp-other-topic", {"startingOffsetsByTimestamp": '{"u": {"0": 1}}'},
      "startingOffsetsByTimestamp", "not subscribed"),
    k("timestamp-strategy", {"startingOffsetsByTimestampStrategy": "skip"}, "startingOffsetsByTimestampStrategy",
      "must be 'error' or 'latest'"),
    k("batch-ending-timestamp-negative", {"endingTimestamp": "-5"}, "endingTimestamp", "milliseconds since the epoch",
      "batch"),
    k("batch-ending-offsets-by-timestamp-word", {"endingOffsetsByTimestamp": "latest"}, "endingOffsetsByTimestamp",
      "ms since the epoch", "batch"),
    # how much a trigger, a task reads
    k("max-offsets-zero", {"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger", "positive integer"),
    k("max-offsets-word", {"maxOffsetsPerTrigger": "10k"}, "maxOffsetsPerTrigger", "positive integer"),
    k("min-offsets-negative", {"minOffsetsPerTrigger": "-1"}, "minOffsetsPerTrigger", "positive integer"),
    k("min-above-max-offsets", {"minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, "minOffsetsPerTrigger",
      "higher than"),
    k("max-trigger-delay-word", {"maxTriggerDelay": "soon"}, "maxTriggerDelay", "must be a duration"),
    k("max-trigger-delay-unit", {"maxTriggerDelay": "5 fortnights"}, "maxTriggerDelay", "must be a duration"),
    k("idle-poll-interval-negative", {"idlePollInterval": "-5"}, "idlePollInterval", "must be a duration"),
    k("min-partitions-zero", {"minPartitions": "0"}, "minPartitions", "positive integer"),
    k("max-records-per-partition-word", {"maxRecordsPerPartition": "x"}, "maxRecordsPerPartition",
      "positive integer"),
    k("poll-timeout-zero", {"kafkaConsumer.pollTimeoutMs": "0"}, "kafkaConsumer.pollTimeoutMs", "positive integer"),
    k("fetch-offset-timeout-negative", {"fetchOffset.timeoutMs": "-1"}, "fetchOffset.timeoutMs", "positive integer"),
    k("fetch-offset-retries-negative", {"fetchOffset.numRetries": "-1"}, "fetchOffset.numRetries", "integer >= 0"),
    k("fetch-offset-retry-interval-word", {"fetchOffset.retryIntervalMs": "x"}, "fetchOffset.retryIntervalMs",
      "integer >= 0"),
    # the rows
    k("fail-on-data-loss", {"failOnDataLoss": "maybe"}, "failOnDataLoss", "true or false"),
    k("include-headers", {"includeHeaders": "yes please"}, "includeHeaders", "true or false"),
    k("row-format", {"rowFormat": "csv"}, "rowFormat", "'arrow' or 'tuples'"),
    # what the data source's schema() checks (before Spark says whether it reads a batch or a stream)
    k("schema-include-headers", {"includeHeaders": "2"}, "includeHeaders", "true or false", "common"),
    k("schema-no-subscription", {"subscribe": None}, None, "exactly one of the options", "common"),
    k("schema-refused-setting", {"kafka.enable.auto.commit": "true"}, "kafka.enable.auto.commit", "consumer group",
      "common"),
]


def _spark_options(base: Mapping[str, str], changes: Mapping[str, str | None]) -> CaseInsensitiveDict:
    """``base`` with ``changes`` (None removes a key), as Spark hands options to a data source."""
    merged = {**base, **changes}
    return CaseInsensitiveDict({key: value for key, value in merged.items() if value is not None})


def _parse_kafka(case: KafkaCase) -> Any:
    options = _spark_options(KAFKA_BASE, case.options)
    if case.entry == "common":
        return check_common_options(options)
    return KafkaSourceOptions.from_options(options, batch=case.entry == "batch")


@pytest.mark.parametrize("case", KAFKA_CASES, ids=[c.name for c in KAFKA_CASES])
def test_a_bad_kafka_option_is_a_typed_error_naming_it(case: KafkaCase) -> None:
    with pytest.raises(KafkaOptionError) as ei:
        _parse_kafka(case)
    e = ei.value
    assert isinstance(e, KafkaSourceError) and isinstance(e, errors.LakestepError) and isinstance(e, ValueError)
    message = str(e)
    assert case.fragment in message, message
    assert e.option == case.option, (e.option, message)
    if case.option is not None:
        assert repr(case.option) in message or case.option in message, message
    else:  # no one option at fault: the message names the ones to choose from
        assert "'subscribe'" in message and "'assign'" in message, message
    assert SECRET not in message, message


def test_the_kafka_base_options_parse() -> None:
    """The rows fail for their own change, not for the base they change."""
    for entry in ("stream", "batch", "common"):
        _parse_kafka(KafkaCase("base", {}, None, "", entry))


# ------------------------------------------------------------------------ lakestep
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
ROWS = StructType([StructField("id", LongType()), StructField("name", StringType())])  # the rows a writer gets


@dataclass(frozen=True)
class LakestepCase:
    name: str
    use: str  # how Spark uses the data source: read, write, stream-read, stream-write, schema
    options: Mapping[str, str | None]  # over the base (catalog, table, job); None removes a key
    error: type[Exception]
    fragment: str  # in the message; names the option
    marks: tuple[Any, ...] = field(default=())



LAKESTEP_CASES = [
    # options every use needs
    LakestepCase("schema-no-catalog", "schema", {"catalog": None}, errors.InvalidArgumentError, "'catalog'"),
    LakestepCase("schema-no-table", "schema", {"table": None}, errors.InvalidArgumentError, "'table'"),
    LakestepCase("read-no-catalog", "read", {"catalog": None}, errors.InvalidArgumentError, "'catalog'"),
    LakestepCase("write-no-table", "write", {"table": None}, errors.InvalidArgumentError, "'table'"),
    LakestepCase("stream-read-no-catalog", "stream-read", {"catalog": None}, errors.InvalidArgumentError, "'catalog'"),
    LakestepCase("stream-read-no-table", "stream-read", {"table": None}, errors.InvalidArgumentError, "'table'"),
    LakestepCase("stream-read-no-job", "stream-read", {"job": None}, errors.InvalidArgumentError, "'job'"),
    LakestepCase("stream-write-no-catalog", "stream-write", {"catalog": None}, errors.InvalidArgumentError,
                 "'catalog'"),
    LakestepCase("stream-write-no-table", "stream-write", {"table": None}, errors.InvalidArgumentError, "'table'"),
    # storage.<name>: the object-store options
    LakestepCase("storage-unknown", "read", {"storage.bucket_size": "1"}, errors.InvalidArgumentError,
                 "bucket_size"),
    LakestepCase("storage-not-a-number", "stream-write", {"storage.connect_timeout": "soon"},
                 errors.InvalidArgumentError, "connect_timeout"),
    LakestepCase("storage-not-a-bool", "stream-read", {"storage.force_virtual_addressing": "maybe"},
                 errors.InvalidArgumentError, "force_virtual_addressing"),
    # the streaming source
    LakestepCase("max-barriers-zero", "stream-read", {"maxBarriersPerTrigger": "0"}, errors.InvalidArgumentError,
                 "maxBarriersPerTrigger"),
    # was a bare ValueError (int() of the option)
    LakestepCase("max-barriers-word", "stream-read", {"maxBarriersPerTrigger": "many"}, errors.InvalidArgumentError,
                 "maxBarriersPerTrigger"),
    LakestepCase("catalog-wait-word", "stream-read", {"catalogWaitSeconds": "soon"}, errors.InvalidArgumentError,
                 "catalogWaitSeconds"),
    LakestepCase("catalog-wait-negative", "stream-read", {"catalogWaitSeconds": "-5"}, errors.InvalidArgumentError,
                 "catalogWaitSeconds"),
    # the streaming sink
    LakestepCase("sink-catalog-wait-word", "stream-write", {"catalogWaitSeconds": "soon"},
                 errors.InvalidArgumentError, "catalogWaitSeconds"),
    LakestepCase("sink-mode", "stream-write", {"mode": "upsert"}, errors.InvalidArgumentError, "option mode"),
    LakestepCase("sink-update-without-key", "stream-write", {"mode": "update"}, errors.InvalidArgumentError,
                 "update mode"),
    LakestepCase("sink-merge-schema", "stream-write", {"mergeSchema": "maybe"}, errors.InvalidArgumentError,
                 "mergeSchema"),
    # batch reads
    LakestepCase("read-version-word", "read", {"versionAsOf": "latest"}, errors.QueryError, "versionAsOf"),
    LakestepCase("read-barrier-word", "read", {"barrier": "last"}, errors.QueryError, "barrier"),
    LakestepCase("read-two-time-travels", "read", {"versionAsOf": "0", "snapshot": "s1"}, errors.QueryError,
                 "versionAsOf"),
    LakestepCase("read-level", "read", {"level": "dirty"}, errors.InvalidArgumentError, "level"),
    LakestepCase("read-scope", "read", {"level": "read_committed", "scope": "galaxy"}, errors.InvalidArgumentError,
                 "scope"),
    LakestepCase("read-max-partitions-zero", "read", {"maxPartitions": "0"}, errors.QueryError, "maxPartitions"),
    LakestepCase("read-max-partitions-word", "read", {"maxPartitions": "lots"}, errors.QueryError, "maxPartitions"),
    LakestepCase("read-lease-word", "read", {"level": "read_committed", "leaseSeconds": "soon"}, errors.QueryError,
                 "leaseSeconds"),
    LakestepCase("read-timestamp-word", "read", {"timestampAsOf": "yesterday"}, errors.QueryError, "timestampAsOf"),
    # batch writes
    LakestepCase("write-batch-id-without-job", "write", {"job": None, "batchId": "7"}, errors.QueryError,
                 "option batchId needs option job"),
    LakestepCase("write-batch-id-word", "write", {"batchId": "seven"}, errors.QueryError, "batchId"),
    LakestepCase("write-merge-schema", "write", {"mergeSchema": "maybe"}, errors.InvalidArgumentError, "mergeSchema"),
]


@pytest.fixture
def lakestep_base(shared_catalog: tuple[Any, Catalog]) -> Iterator[dict[str, str]]:
    """A catalog with the table ``s.t`` (no primary key): the options that name it, and a job. The
    module's catalog of the backend (conftest.SharedCatalogs), the table made once: a refused option
    commits nothing."""
    from lakestep.streaming import catalog_cache

    catalog = shared_catalog[1]
    if "s" not in catalog.list_namespaces():
        catalog.create_namespace("s")
        catalog.create_table("s.t", SCHEMA)
    head = catalog.load_table("s.t").version
    yield {"catalog": catalog.url, "table": "s.t", "job": "j"}
    for key in [key for key in catalog_cache._catalogs if key[0] == catalog.url]:  # opened by the data source
        catalog_cache._catalogs.pop(key).close()
    assert catalog.load_table("s.t").version == head, "a refused option committed"


def _use(source: LakestepDataSource, use: str) -> Any:
    """What Spark calls on the data source for ``use``."""
    if use == "schema":
        return source.schema()
    if use == "read":
        return source.reader(None)
    if use == "write":
        return source.writer(ROWS, False)
    if use == "stream-read":
        return source.streamReader(None)
    assert use == "stream-write", use
    return source.streamWriter(ROWS, False)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=c.marks) for c in LAKESTEP_CASES])
def test_a_bad_lakestep_option_is_a_typed_error_naming_it(lakestep_base: dict[str, str],
                                                          case: LakestepCase) -> None:
    source = LakestepDataSource(_spark_options(lakestep_base, case.options))
    with pytest.raises(case.error) as ei:
        _use(source, case.use)
    e = ei.value
    assert isinstance(e, errors.LakestepError) and isinstance(e, ValueError)
    assert case.fragment in str(e), str(e)
