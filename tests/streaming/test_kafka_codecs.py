"""Kafka topics as real producers write them (issue 13 §4): every codec of the protocol,
written by librdkafka (confluent-kafka), read by ``lakestep-kafka`` exactly once and byte for
byte; a batch that cannot be decoded is a :class:`KafkaDecodeError` naming where it is."""

from __future__ import annotations

import os
import struct
from typing import TYPE_CHECKING, Any, Callable

import pytest

from lakestep.streaming.kafka.errors import KafkaDecodeError
from lakestep.streaming.kafka.kafka_python import import_kafka_python
from lakestep.streaming.kafka.offsets import OffsetClient
from lakestep.streaming.kafka.options import KafkaSourceOptions
from lakestep.streaming.kafka.reader import read_partition_range
from tests.streaming.kafka_helpers import await_end, batch_sizes, memory_query, stream

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestep.testing import TansuBroker

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def test_every_kafka_codec_is_installed() -> None:
    """What ``pip install lakestep[spark]`` brings decodes every codec of the protocol."""
    import_kafka_python()
    from kafka import codec

    assert codec.has_gzip() and codec.has_snappy() and codec.has_lz4() and codec.has_zstd()


def _librdkafka_records(codec_index: int) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    """(key, value, headers) per record: null keys and values, empty ones, headers (also
    repeated keys and null values), and values near 1 MB, random and compressible."""
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = []
    for i in range(60):
        key = None if i % 5 == 0 else (b"" if i % 7 == 0 else f"key-{codec_index}-{i}".encode())
        value = None if i % 6 == 0 else (b"" if i % 11 == 0 else os.urandom(i * 37 % 300))
        headers = [] if i % 3 == 0 else [("trace", os.urandom(8)), ("n\u00e9", None), ("trace", b"")]
        records.append((key, value, headers))
    records.insert(20, (b"big-random", os.urandom(1_000_000 - 64), [("h", b"x")]))
    records.insert(40, (None, b"z" * 1_000_000, []))  # compresses to almost nothing
    return records


@pytest.mark.spark
@pytest.mark.kafka
def test_librdkafka_producer_every_codec_exactly_once(
    kafka_spark: SparkSession, kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str]
) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, len(CODECS))
    expected: dict[tuple[int, int], tuple[Any, ...]] = {}
    failures: list[Any] = []
    for partition, codec in enumerate(CODECS):  # one producer (and codec) per partition
        producer = confluent_kafka.Producer({
            "bootstrap.servers": kafka_broker.bootstrap_servers,
            "compression.type": codec,
            "enable.idempotence": True,
            "linger.ms": 20,
            "message.max.bytes": 2_000_000,
        })
        for key, value, headers in _librdkafka_records(partition):

            def delivered(err: Any, msg: Any, record: tuple[Any, ...] = (key, value, headers)) -> None:
                if err is not None:
                    failures.append(err)
                else:
                    expected[(msg.partition(), msg.offset())] = record

            producer.produce(topic, value=value, key=key, partition=partition, headers=headers or None,
                             on_delivery=delivered)
        assert producer.flush(60) == 0
    assert not failures
    assert len(expected) == 62 * len(CODECS)

    df = stream(kafka_spark, kafka_broker, topic, startingOffsets="earliest", includeHeaders="true")
    query, name = memory_query(df, availableNow=True)
    await_end(query, 180)
    rows = kafka_spark.table(name).collect()
    assert sum(batch_sizes(query)) == len(rows) == len(expected)  # each record exactly once
    got = {
        (r["partition"], r["offset"]): (r["key"], r["value"], [(h["key"], h["value"]) for h in r["headers"]])
        for r in rows
    }
    assert len(got) == len(rows)
    assert got.keys() == expected.keys()
    for where, record in expected.items():  # byte for byte (compared one by one: 1 MB values)
        assert got[where] == record, where


def _corrupt_snappy_batch(values: list[bytes]) -> bytes:
    """A v2 batch whose attributes say snappy but whose records are not compressed
    (its CRC is right, so only decompressing finds the problem)."""
    import_kafka_python()
    from kafka.record.memory_records import MemoryRecordsBuilder
    from kafka.record.util import calc_crc32c

    builder = MemoryRecordsBuilder(2, 0, batch_size=1 << 30, offset=0)
    for value in values:
        builder.append(1_700_000_000_000, None, value, [])
    builder.close()
    data = bytearray(builder.buffer())
    (attributes,) = struct.unpack_from(">h", data, 21)
    struct.pack_into(">h", data, 21, attributes | 2)  # snappy
    struct.pack_into(">I", data, 17, calc_crc32c(memoryview(data)[21:]))
    return bytes(data)


@pytest.fixture
def corrupt_topic(kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str]) -> str:
    """Partition 0: offsets 0-1 fine, 2-4 an undecodable batch, 5 fine."""
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 1)
    kafka_broker.produce(topic, [b"a", b"b"], partition=0)
    assert kafka_broker.append_raw(topic, 0, _corrupt_snappy_batch([b"x" * 50, b"y", b"z"])) == 2
    assert kafka_broker.produce(topic, [b"c"], partition=0) == [(0, 5)]
    return topic


@pytest.mark.kafka
def test_undecodable_batch_is_a_typed_error(
    kafka_broker: TansuBroker, corrupt_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lakestep.streaming.kafka.reader as reader

    options = KafkaSourceOptions.from_options(
        {"kafka.bootstrap.servers": kafka_broker.bootstrap_servers, "subscribe": corrupt_topic}
    )
    # the column-wise decoder and kafka-python's own one: the same error
    for segmented in (True, False):
        monkeypatch.setattr(reader, "_SEGMENTED_READS", segmented)
        with pytest.raises(KafkaDecodeError) as failed:
            list(read_partition_range(options, corrupt_topic, 0, 0, 6))
        assert (failed.value.topic, failed.value.partition, failed.value.offset) == (corrupt_topic, 0, 2)
        assert f"at offset 2 of topic '{corrupt_topic}' partition 0" in str(failed.value)
        assert "snappy" in str(failed.value)
        # the records before it are readable
        rows = [r for b in read_partition_range(options, corrupt_topic, 0, 0, 2) for r in b.to_pylist()]
        assert [r["value"] for r in rows] == [b"a", b"b"]

    # the driver's high-watermark probe does not decode records: it sees past the batch
    client = OffsetClient(options.consumer_config, 10_000)
    try:
        assert client.high_watermarks({(corrupt_topic, 0): 0}) == {(corrupt_topic, 0): 6}
    finally:
        client.close()


@pytest.mark.spark
@pytest.mark.kafka
def test_undecodable_batch_fails_the_query_naming_it(
    kafka_spark: SparkSession, kafka_broker: TansuBroker, corrupt_topic: str
) -> None:
    from pyspark.errors import StreamingQueryException

    df = stream(kafka_spark, kafka_broker, corrupt_topic, startingOffsets="earliest")
    query, _ = memory_query(df, availableNow=True)
    with pytest.raises(StreamingQueryException) as failed:
        query.awaitTermination(120)
    message = str(failed.value)
    assert "KafkaDecodeError" in message
    assert f"at offset 2 of topic '{corrupt_topic}' partition 0" in message
    assert not query.isActive
