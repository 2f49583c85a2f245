"""The ``lakestep-kafka`` Spark source against a real (tansu) broker and real Spark.

Pure option handling is tested without Spark or Kafka; everything else runs
streaming queries in local mode. Each Spark micro-batch costs about a second,
so tests keep the number of batches small.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pytest

from lakestep.streaming.kafka import (
    FORMAT_NAME,
    KafkaSourceOptions,
    arrow_schema,
    kafka_consumer_config,
    kafka_schema,
    parse_starting_offsets,
)
from lakestep.streaming.kafka.kafka_python import import_kafka_python
from lakestep.streaming.kafka.offsets import OffsetClient, offsets_from_json, offsets_to_json, rate_limit, split_ranges
from lakestep.streaming.kafka.reader import read_partition_range
from tests.streaming.kafka_helpers import (
    await_end,
    batch_sizes,
    keyed,
    memory_query,
    produce_per_partition,
    stream,
)
from tests.waiting import wait_until

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from lakestep.testing import TansuBroker


# ============================================================================ pure option handling


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            {
                "kafka.bootstrap.servers": "a:9092, b:9093",
                "kafka.security.protocol": "SASL_SSL",
                "kafka.sasl.mechanism": "PLAIN",
                "kafka.sasl.plain.username": "alice",
                "kafka.sasl.plain.password": "secret",
                "kafka.ssl.cafile": "/etc/ca.pem",
            },
            {
                "bootstrap_servers": ["a:9092", "b:9093"],
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "PLAIN",
                "sasl_plain_username": "alice",
                "sasl_plain_password": "secret",
                "ssl_cafile": "/etc/ca.pem",
            },
        ),
        (  # Java client names as Spark users write them
            {
                "KAFKA.BOOTSTRAP.SERVERS": "a:9092",
                "kafka.sasl.mechanism": "SCRAM-SHA-512",
                "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
                'required username="bob" password="p\\"w";',
                "kafka.ssl.endpoint.identification.algorithm": "",
                "kafka.ssl.key.password": "kp",
                "kafka.request.timeout.ms": "15000",
                "kafka.check.crcs": "false",
                "kafka.api.version": "2.8.0",
                "kafka.socket.receive.buffer.bytes": "65536",
                "startingOffsets": "earliest",  # not a kafka.* option: ignored here
            },
            {
                "bootstrap_servers": ["a:9092"],
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_plain_username": "bob",
                "sasl_plain_password": 'p"w',
                "ssl_check_hostname": False,
                "ssl_password": "kp",
                "request_timeout_ms": 15000,
                "check_crcs": False,
                "api_version": (2, 8, 0),
                "receive_buffer_bytes": 65536,
            },
        ),
        (  # librdkafka names
            {
                "kafka.bootstrap.servers": "a:9092",
                "kafka.sasl.username": "u",
                "kafka.sasl.password": "p",
                "kafka.ssl.ca.location": "/ca.pem",
                "kafka.ssl.certificate.location": "/c.pem",
                "kafka.ssl.key.location": "/k.pem",
            },
            {
                "bootstrap_servers": ["a:9092"],
                "sasl_plain_username": "u",
                "sasl_plain_password": "p",
                "ssl_cafile": "/ca.pem",
                "ssl_certfile": "/c.pem",
                "ssl_keyfile": "/k.pem",
            },
        ),
    ],
    ids=["kafka-python-names", "java-names", "librdkafka-names"],
)
def test_consumer_config_maps_spark_options(options: dict[str, str], expected: dict[str, Any]) -> None:
    assert kafka_consumer_config(options) == expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "'kafka.bootstrap.servers' is required"),
        ({"kafka.bootstrap.servers": "a:1", "kafka.group.instance.id": "g"}, "never joins a consumer group"),
        ({"kafka.bootstrap.servers": "a:1", "kafka.enable.auto.commit": "true"}, "consumer group"),
        ({"kafka.bootstrap.servers": "a:1", "kafka.auto.offset.reset": "earliest"}, "startingOffsets"),
        ({"kafka.bootstrap.servers": "a:1", "kafka.value.deserializer": "x"}, "binary"),
        ({"kafka.bootstrap.servers": "a:1", "kafka.ssl.truststore.location": "/t.jks"}, "PEM"),
        ({"kafka.bootstrap.servers": "a:1", "kafka.no.such.setting": "1"}, "'kafka.no.such.setting'"),
        ({"kafka.bootstrap.servers": "a:1", "kafka.request.timeout.ms": "soon"}, "invalid value"),
        ({"kafka.bootstrap.servers": "a:1", "kafka.sasl.jaas.config": "x.Krb5LoginModule required;"}, "jaas"),
    ],
)
def test_consumer_config_refuses_bad_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kafka_consumer_config(options)


def test_group_id_is_accepted_and_unused() -> None:
    """A job moved from format("kafka") keeps its kafka.group.id / groupIdPrefix: no group is joined."""
    assert kafka_consumer_config({"kafka.bootstrap.servers": "a:1", "kafka.group.id": "etl"}) == (
        kafka_consumer_config({"kafka.bootstrap.servers": "a:1"})
    )


def test_secrets_do_not_leak_into_errors() -> None:
    options = {
        "kafka.bootstrap.servers": "a:1",
        "kafka.sasl.plain.password": "hunter2",
        "kafka.sasl.password": "other-secret",
    }
    with pytest.raises(ValueError, match="both set") as info:
        kafka_consumer_config(options)
    assert "hunter2" not in str(info.value) and "other-secret" not in str(info.value)


def test_source_options_validation() -> None:
    base = {"kafka.bootstrap.servers": "a:1", "subscribe": "t1, t2,t1"}
    opts = KafkaSourceOptions.from_options({**base, "maxOffsetsPerTrigger": "10", "includeHeaders": "TRUE"})
    assert opts.topics == ("t1", "t2")
    assert opts.starting_offsets == "latest"  # Spark's default for streaming
    assert opts.max_offsets_per_trigger == 10 and opts.include_headers
    assert opts.fail_on_data_loss and opts.pattern is None and opts.assign is None
    assert not KafkaSourceOptions.from_options({**base, "failOnDataLoss": "false"}).fail_on_data_loss
    assigned = KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "a:1", "assign": '{"b": [2, 0], "a": [1]}'})
    assert assigned.assign == (("a", 1), ("b", 0), ("b", 2)) and assigned.topics == ("a", "b")
    pattern = KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "a:1", "subscribePattern": "ord.*"})
    assert pattern.pattern is not None and pattern.pattern.fullmatch("orders") and not pattern.pattern.fullmatch("xorders")
    bad = [
        ({"kafka.bootstrap.servers": "a:1"}, "exactly one of the options 'subscribe'.*is required$"),
        ({**base, "assign": '{"t1":[0]}'}, "exactly one of .*; got subscribe, assign"),
        ({"kafka.bootstrap.servers": "a:1", "assign": '{"t1": 0}'}, "'assign' must be JSON like"),
        ({"kafka.bootstrap.servers": "a:1", "subscribePattern": "t("}, "'subscribePattern' is not a valid"),
        ({**base, "maxOffsetsPerTrigger": "0"}, "'maxOffsetsPerTrigger' must be a positive integer"),
        ({**base, "endingOffsets": "latest"}, "not valid for streaming"),
        ({**base, "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({**base, "startingOffsets": "yesterday"}, "'startingOffsets'"),
        ({**base, "rowFormat": "csv"}, "'rowFormat'"),
        ({**base, "minPartitions": "-1"}, "'minPartitions' must be a positive integer"),
        ({**base, "maxPartitions": "3"}, "'maxPartitions' is not supported"),
    ]
    for options, message in bad:
        with pytest.raises(ValueError, match=message):
            KafkaSourceOptions.from_options(options)


def test_parse_starting_offsets() -> None:
    assert parse_starting_offsets("EARLIEST", ["t"]) == "earliest"
    assert parse_starting_offsets(None, ["t"]) == "latest"
    assert parse_starting_offsets('{"t": {"0": 23, "1": -2, "2": -1}}', ["t"]) == {
        ("t", 0): 23,
        ("t", 1): -2,
        ("t", 2): -1,
    }
    for text, message in [
        ('{"u": {"0": 1}}', "not subscribed"),
        ('{"t": {"x": 1}}', "not an integer"),
        ('{"t": {"0": -3}}', "-2 \\(earliest\\)"),
        ('{"t": {"0": 1.5}}', "-2 \\(earliest\\)"),
        ("[1]", "non-empty object"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_starting_offsets(text, ["t"])


def test_offsets_json_is_canonical() -> None:
    offsets = {("b", 10): 5, ("a", 2): 1, ("b", 9): 0}
    as_json = offsets_to_json(offsets)
    assert json.dumps(as_json) == '{"a": {"2": 1}, "b": {"9": 0, "10": 5}}'
    assert offsets_from_json(as_json) == offsets


def test_rate_limit_spreads_like_spark() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 7}
    until = {("t", 0): 300, ("t", 1): 200, ("t", 2): 7}
    # 400 pending, limit 100: 75 from p0, 25 from p1, nothing pending in p2
    assert rate_limit(start, until, 100) == {("t", 0): 75, ("t", 1): 125, ("t", 2): 7}
    # a share below one record is rounded up so a small partition is not starved
    assert rate_limit({("t", 0): 0, ("t", 1): 0}, {("t", 0): 1000, ("t", 1): 1}, 10) == {
        ("t", 0): 9,
        ("t", 1): 1,
    }
    assert rate_limit(start, start, 5) == start


def test_split_ranges_like_spark_min_partitions() -> None:
    a, b, c = ("t", 0), ("t", 1), ("u", 0)
    ranges = [(a, 1, 501), (b, 1, 2), (c, 7, 7)]
    assert split_ranges(ranges, None) == ranges[:2]  # empty ranges are dropped
    assert split_ranges(ranges, 2) == ranges[:2]  # enough ranges already
    # a small range stays whole; the large one gets the other pieces (Spark's skew case)
    assert split_ranges(ranges, 3) == [(a, 1, 251), (a, 251, 501), (b, 1, 2)]
    # an inexact split: the last piece takes the remainder
    assert split_ranges([(a, 1, 11)], 3) == [(a, 1, 4), (a, 4, 7), (a, 7, 11)]
    # more pieces than offsets: pieces are never empty
    assert split_ranges([(a, 0, 2)], 5) == [(a, 0, 1), (a, 1, 2)]
    pieces = split_ranges([(a, 0, 1000), (b, 0, 3000)], 8)
    assert [(tp, s, e) for tp, s, e in pieces if tp == a] == [(a, 0, 500), (a, 500, 1000)]
    assert len(pieces) == 8 and sum(e - s for _, s, e in pieces) == 4000
    opts = KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "a:1", "subscribe": "t", "minPartitions": "4"})
    assert opts.min_partitions == 4


def test_split_ranges_like_spark_max_records_per_partition() -> None:
    """maxRecordsPerPartition cuts first (ceil(size / max) pieces), then minPartitions, which keeps
    every piece of a topic-partition whole once one of its pieces is too small to split (Spark's
    KafkaOffsetRangeCalculator keys that by topic-partition)."""
    a, b = ("t", 0), ("t", 1)
    assert split_ranges([(a, 0, 5), (b, 0, 3)], None, 2) == [(a, 0, 1), (a, 1, 3), (a, 3, 5), (b, 0, 1), (b, 1, 3)]
    assert split_ranges([(a, 0, 4)], None, 4) == [(a, 0, 4)]  # a range of exactly max offsets stays whole
    assert split_ranges([(a, 0, 4)], None, 100) == [(a, 0, 4)]
    # minPartitions after the cut: 8 wanted, but a 1-offset piece of each partition pins both whole
    assert split_ranges([(a, 0, 5), (b, 0, 3)], 8, 2) == [(a, 0, 1), (a, 1, 3), (a, 3, 5), (b, 0, 1), (b, 1, 3)]
    # two pieces of 5, each big enough to be cut in two for minPartitions=4
    assert split_ranges([(a, 0, 10)], 4, 5) == [(a, 0, 2), (a, 2, 5), (a, 5, 7), (a, 7, 10)]
    # minPartitions already met by the cut: nothing more
    assert split_ranges([(a, 0, 10)], 2, 3) == [(a, 0, 2), (a, 2, 4), (a, 4, 7), (a, 7, 10)]
    opts = KafkaSourceOptions.from_options(
        {"kafka.bootstrap.servers": "a:1", "subscribe": "t", "maxRecordsPerPartition": "1000"})
    assert opts.max_records_per_partition == 1000
    with pytest.raises(ValueError, match="'maxRecordsPerPartition' must be a positive integer"):
        KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "a:1", "subscribe": "t",
                                         "maxRecordsPerPartition": "0"})


def test_arrow_schema_is_what_pyspark_expects() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    for headers in (False, True):
        assert arrow_schema(headers).equals(to_arrow_schema(kafka_schema(headers), timezone="UTC"))


def test_package_loads_lazily_and_exports_its_public_names() -> None:
    """Importing the package (as the test broker does) needs neither pyspark nor
    kafka-python; every public name resolves."""
    import subprocess
    import sys

    code = (
        "import sys, lakestep.streaming.kafka as k, lakestep.testing\n"
        "assert 'pyspark' not in sys.modules and 'kafka' not in sys.modules, sorted(sys.modules)\n"
        "from lakestep.streaming.kafka import *\n"
        "missing = [n for n in k.__all__ if getattr(k, n, None) is None]\n"
        "assert not missing, missing\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ============================================================================ kafka helpers


@pytest.mark.kafka
def test_driver_metadata_requests_are_not_held_back(
    kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str]
) -> None:
    """kafka-python 3.0 spaces Metadata requests by a retry_backoff_ms that its cluster metadata
    never receives from the consumer (100 ms, whatever is given), and a query's start asks three
    times in a row. The driver's client sets it there: 10 ms, or the user's kafka.retry.backoff.ms.
    A forced refresh still asks the broker: a topic created just before it is seen."""
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 1)
    for options, expected in (({}, 10), ({"kafka.retry.backoff.ms": "250"}, 250)):
        config = kafka_consumer_config({"kafka.bootstrap.servers": kafka_broker.bootstrap_servers, **options})
        client = OffsetClient(config, 10_000)
        try:
            assert client._consumer._cluster.config["retry_backoff_ms"] == expected
            assert client.partitions([topic], force=True) == [(topic, 0)]
            later = kafka_topic_name()
            kafka_broker.create_topic(later, 2)
            assert client.partitions([topic, later], force=True, missing_ok=True) == [
                (topic, 0), (later, 0), (later, 1)]
        finally:
            client.close()


@pytest.mark.kafka
def test_a_trigger_right_after_a_produce_sees_the_records(
    kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str]
) -> None:
    """Records produced just before a trigger are in its end offsets. The high-watermark probe's
    last fetch of the trigger before, sent before the records were, can still be in flight or
    buffered; it asks the same partition at the same position, and its answer must not be
    taken (it was, in ~2-3% of triggers, once Metadata requests stopped spacing them by 100 ms)."""
    from lakestep.streaming.kafka.options import KafkaSourceOptions
    from lakestep.streaming.kafka.source import KafkaStreamReader

    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 2)
    reader = KafkaStreamReader(KafkaSourceOptions.from_options(
        {"kafka.bootstrap.servers": kafka_broker.bootstrap_servers, "subscribe": topic,
         "startingOffsets": "earliest"}))
    try:
        offset = reader.initialOffset()
        produced, late = 0, 0
        for _ in range(300):
            kafka_broker.produce(topic, [b"x", b"y", b"z"])
            produced += 3
            offset = reader.latestOffset(offset, reader.getDefaultReadLimit())
            late += sum(offset[topic].values()) != produced
        assert late == 0
    finally:
        reader.stop()


@pytest.mark.kafka
def test_high_watermark_comes_from_fetch(
    kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str]
) -> None:
    """The end of a partition is read from a Fetch response (ListOffsets(latest) can lie)."""
    from kafka import KafkaConsumer, TopicPartition

    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 2)
    for _ in range(3):  # several record batches in partition 0
        kafka_broker.produce(topic, [b"x"] * 4, partition=0)
    config = kafka_consumer_config({"kafka.bootstrap.servers": kafka_broker.bootstrap_servers})
    client = OffsetClient(config, 10_000)
    try:
        tps = client.partitions([topic], force=True)
        assert tps == [(topic, 0), (topic, 1)]
        assert client.earliest(tps) == {(topic, 0): 0, (topic, 1): 0}
        # Probes reuse one consumer; from the start, the end and the middle, in turn
        # (a reused kafka-python consumer once wedged on exactly this sequence).
        starts = [{(topic, 0): o, (topic, 1): 0} for o in (0, 0, 12, 12, 5, 0, 12)]
        for start in starts:
            assert client.high_watermarks(start) == {(topic, 0): 12, (topic, 1): 0}
    finally:
        client.close()
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap_servers, enable_auto_commit=False)
    try:
        listed = consumer.end_offsets([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]
    finally:
        consumer.close()
    # tansu 0.6 answers "base offset of the last batch + 1" (9 here); a correct broker says 12.
    assert listed in (9, 12)


@pytest.mark.kafka
def test_partition_reader_reads_exactly_its_range(
    kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import lakestep.streaming.kafka.reader as reader
    from lakestep.streaming.kafka import batches

    # the installed kafka-python is one the column-wise decoder plugs into
    assert batches._partition_records_class() is not None
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 1)
    expected = produce_per_partition(kafka_broker, topic, [25])
    import_kafka_python()
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers, compression_type="gzip")
    try:  # a compressed batch: the range ends inside it
        for i in range(25, 40):
            producer.send(topic, value=f"v-0-{i}".encode(), key=f"k{i}".encode(), partition=0)
            expected[(0, i)] = f"v-0-{i}".encode()
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)
    for row_format, segmented in (("arrow", True), ("arrow", False), ("tuples", False)):
        monkeypatch.setattr(reader, "_SEGMENTED_READS", segmented)
        options = KafkaSourceOptions.from_options(
            {
                "kafka.bootstrap.servers": kafka_broker.bootstrap_servers,
                "subscribe": topic,
                "rowFormat": row_format,
            }
        )
        for first, stop in ((3, 17), (20, 33)):
            out = list(read_partition_range(options, topic, 0, first, stop))
            if row_format == "arrow":
                rows = [tuple(r.values()) for batch in out for r in batch.to_pylist()]
            else:
                rows = out
            assert [r[4] for r in rows] == list(range(first, stop))
            assert [r[1] for r in rows] == [expected[(0, o)] for o in range(first, stop)]
            assert [r[0] for r in rows] == [f"k{o}".encode() for o in range(first, stop)]
            assert {(r[2], r[3], r[6]) for r in rows} == {(topic, 0, 0)}


@pytest.mark.kafka
def test_broker_startup_failure_shows_its_output() -> None:
    from lakestep.testing import TansuBroker, TansuBrokerError

    broker = TansuBroker(extra_args=["--no-such-flag"], startup_timeout=10)
    with pytest.raises(TansuBrokerError, match="(?s)exited with code 2.*--no-such-flag"):
        broker.start()
    assert broker.pid is None


# ============================================================================ spark


@pytest.fixture
def topic3(kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str]) -> str:
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 3)
    return topic


@pytest.mark.spark
@pytest.mark.kafka
def test_available_now_reads_every_record_exactly_once(
    kafka_spark: SparkSession, kafka_broker: TansuBroker, topic3: str
) -> None:
    expected = produce_per_partition(kafka_broker, topic3, [7, 5, 0])
    # a record without key, a tombstone (no value) and headers, in partition 2
    kafka_broker.produce(topic3, [b"no-key"], partition=2)
    kafka_broker.produce(topic3, [None], partition=2, keys=[b"tomb"], headers=[("h1", b"x"), ("h2", b"")])
    expected[(2, 0)] = b"no-key"
    expected[(2, 1)] = None  # type: ignore[assignment]
    before = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(minutes=5)

    # minPartitions=4: the 7 records of partition 0 are read by two tasks ([0, 3) and [3, 7))
    df = stream(
        kafka_spark, kafka_broker, topic3, startingOffsets="earliest", includeHeaders="true", minPartitions=4
    )
    assert df.schema == kafka_schema(include_headers=True)
    query, name = memory_query(df, availableNow=True)
    await_end(query)
    rows = kafka_spark.table(name).collect()

    assert len(rows) == len(expected) == 14
    assert keyed(rows) == expected
    assert {r["topic"] for r in rows} == {topic3}
    assert {r["timestampType"] for r in rows} == {0}
    assert all(before < r["timestamp"] < before + timedelta(minutes=10) for r in rows)
    by_offset = {(r["partition"], r["offset"]): r for r in rows}
    assert by_offset[(0, 3)]["key"] == b"k3"
    assert by_offset[(2, 0)]["key"] is None
    assert by_offset[(2, 1)]["key"] == b"tomb"
    assert [tuple(h) for h in by_offset[(2, 1)]["headers"]] == [("h1", b"x"), ("h2", b"")]
    assert by_offset[(0, 0)]["headers"] == []
    assert batch_sizes(query) == [14]


@pytest.mark.spark
@pytest.mark.kafka
def test_max_offsets_per_trigger_and_restart_from_checkpoint(
    kafka_spark: SparkSession, kafka_broker: TansuBroker, topic3: str, tmp_path: Path
) -> None:
    expected = produce_per_partition(kafka_broker, topic3, [20, 20, 20])
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def run() -> StreamingQuery:
        df = stream(kafka_spark, kafka_broker, topic3, startingOffsets="earliest", maxOffsetsPerTrigger=30)
        query = (
            df.writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        await_end(query)
        return query

    first = run()
    assert batch_sizes(first) == [30, 30]  # 10 per partition and batch
    progress = first.lastProgress
    assert progress is not None
    end_offset = progress["sources"][0]["endOffset"]  # JSON text for Python sources
    assert json.loads(end_offset) == {topic3: {"0": 20, "1": 20, "2": 20}}

    expected.update(produce_per_partition(kafka_broker, topic3, [5, 0, 3], tag="late"))
    second = run()  # same checkpoint: continues where the first run stopped
    assert batch_sizes(second) == [8]

    rows = kafka_spark.read.parquet(out).collect()
    assert len(rows) == 68
    assert keyed(rows) == expected


@pytest.mark.spark
@pytest.mark.kafka
def test_starting_offsets_json(kafka_spark: SparkSession, kafka_broker: TansuBroker, topic3: str) -> None:
    expected = produce_per_partition(kafka_broker, topic3, [6, 4, 5])
    starting = {topic3: {"0": 2, "1": -2, "2": -1}}
    df = stream(kafka_spark, kafka_broker, topic3, startingOffsets=starting)
    query, name = memory_query(df, availableNow=True)
    await_end(query)
    got = keyed(kafka_spark.table(name).collect())
    assert got == {k: v for k, v in expected.items() if (k[0] == 0 and k[1] >= 2) or k[0] == 1}


@pytest.mark.spark
@pytest.mark.kafka
def test_latest_then_records_produced_while_running(
    kafka_spark: SparkSession, kafka_broker: TansuBroker, topic3: str
) -> None:
    produce_per_partition(kafka_broker, topic3, [3, 3, 3], tag="old")
    df = stream(kafka_spark, kafka_broker, topic3)  # startingOffsets defaults to latest
    query, name = memory_query(df, processingTime="200 milliseconds")
    try:
        query.processAllAvailable()  # the initial (latest) offsets are resolved
        assert kafka_spark.table(name).count() == 0
        expected: dict[tuple[int, int], bytes] = {}
        for round_ in range(3):  # produced while the query runs, no waiting in between
            for partition in range(3):
                values = [f"new-{round_}-{partition}-{i}".encode() for i in range(4)]
                for key, value in zip(kafka_broker.produce(topic3, values, partition=partition), values):
                    expected[key] = value
            seen = len(query.recentProgress)  # the next round goes in after the query ran a trigger
            wait_until(lambda: len(query.recentProgress) > seen or query.exception() is not None, "a trigger",
                       timeout=120)
        query.processAllAvailable()
        rows = kafka_spark.table(name).collect()
    finally:
        query.stop()
    assert len(rows) == 36
    assert keyed(rows) == expected
    assert min(r["offset"] for r in rows) == 3


@pytest.mark.spark
def test_missing_bootstrap_servers_is_a_clear_error(kafka_spark: SparkSession) -> None:
    with pytest.raises(Exception, match="kafka.bootstrap.servers' is required"):
        kafka_spark.readStream.format(FORMAT_NAME).option("subscribe", "t").load()


@pytest.mark.spark
@pytest.mark.kafka
def test_unknown_topic_is_a_clear_error(kafka_spark: SparkSession, kafka_broker: TansuBroker) -> None:
    from pyspark.errors import StreamingQueryException

    missing = f"missing-{uuid.uuid4().hex[:8]}"
    query, _ = memory_query(stream(kafka_spark, kafka_broker, missing), availableNow=True)
    with pytest.raises(StreamingQueryException, match=f"topic\\(s\\) '{missing}' do not exist"):
        query.awaitTermination(60)
    assert not query.isActive
