"""Options of Spark's own Kafka source that ``lakestep-kafka`` also has (issue 15), against
the real (tansu) broker: failOnDataLoss with deleted and recreated topics, subscribePattern
and assign with topics appearing mid-stream.

The driver side (:class:`KafkaStreamReader`: planning, offsets, data-loss accounting) is
driven directly, trigger by trigger, as Spark drives it; fewer tests run whole queries.
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Any, Callable

import pytest

from lakestep.streaming.kafka.errors import KafkaDataLossError
from lakestep.streaming.kafka.options import FORMAT_NAME, KafkaSourceOptions
from lakestep.streaming.kafka.source import DATA_LOSS_KEY, KafkaStreamReader
from tests.streaming.kafka_helpers import keyed, produce_per_partition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakestep.testing import TansuBroker


class Driver:
    """Spark's calls on a stream reader, one trigger at a time; ``read`` runs the tasks here."""

    def __init__(self, broker: TansuBroker, **options: str) -> None:
        self.reader = KafkaStreamReader(
            KafkaSourceOptions.from_options({"kafka.bootstrap.servers": broker.bootstrap_servers, **options})
        )
        self.offset: dict[str, Any] = self.reader.initialOffset()

    def trigger(self) -> dict[tuple[str, int, int], bytes | None]:
        """One micro-batch: {(topic, partition, offset): value} of what it read."""
        end = self.reader.latestOffset(self.offset, self.reader.getDefaultReadLimit())
        rows: dict[tuple[str, int, int], bytes | None] = {}
        if end != self.offset:
            for part in self.reader.partitions(self.offset, end):
                for batch in self.reader.read(part):
                    for r in batch.to_pylist():
                        assert (r["topic"], r["partition"], r["offset"]) not in rows
                        rows[(r["topic"], r["partition"], r["offset"])] = r["value"]
            self.offset = end
        return rows

    def close(self) -> None:
        self.reader.stop()

    def delete_topic(self, broker: TansuBroker, topic: str) -> None:
        """Delete ``topic``, the reader's consumers closed first (as a restart of the query does).

        tansu creates a topic that a Fetch names, and the last long-poll Fetch of the
        reader's high-watermark probe can still be pending at the broker: answered after
        the deletion, it would create the topic again. (A Kafka broker never creates topics
        on Fetch.) The reader connects again at its next trigger."""
        self.reader.stop()
        broker.delete_topic(topic)


def _tagged(topic: str, expected: dict[tuple[int, int], bytes]) -> dict[tuple[str, int, int], bytes]:
    return {(topic, p, o): v for (p, o), v in expected.items()}


@pytest.mark.kafka
def test_deleted_topic_fails_the_query_by_default(
    own_broker: TansuBroker, kafka_topic_name: Callable[[], str]
) -> None:
    topic = kafka_topic_name()
    own_broker.create_topic(topic, 2)
    expected = produce_per_partition(own_broker, topic, [3, 2])
    driver = Driver(own_broker, subscribe=topic, startingOffsets="earliest")
    try:
        assert driver.trigger() == _tagged(topic, expected)
        driver.delete_topic(own_broker, topic)
        with pytest.raises(KafkaDataLossError, match=f"topic\\(s\\) '{topic}' .* were deleted.*failOnDataLoss=false"):
            driver.trigger()
        own_broker.create_topic(topic, 1)  # recreated: its log starts again, below the query's offsets
        produce_per_partition(own_broker, topic, [1])
        with pytest.raises(KafkaDataLossError, match=f"'{topic}'|{topic}-0"):
            driver.trigger()
    finally:
        driver.close()


@pytest.mark.kafka
def test_fail_on_data_loss_false_follows_deleted_and_recreated_topics(
    own_broker: TansuBroker, kafka_topic_name: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    """A topic deleted while read is held; recreated with more partitions and fewer records
    (growth and lost offsets at once), it is read from its new start; each event is one
    warning and is counted in the reported latest offset."""
    topic, other = kafka_topic_name(), kafka_topic_name() + "-other"
    own_broker.create_topic(topic, 1)
    own_broker.create_topic(other, 1)
    first = produce_per_partition(own_broker, topic, [10])
    driver = Driver(own_broker, subscribe=f"{topic},{other}", startingOffsets="earliest", failOnDataLoss="false")
    caplog.set_level(logging.WARNING, logger="lakestep.streaming.kafka")
    try:
        assert driver.trigger() == _tagged(topic, first)
        assert DATA_LOSS_KEY not in (driver.reader.reportLatestOffset() or {})

        driver.delete_topic(own_broker, topic)
        more = produce_per_partition(own_broker, other, [4], tag="other")
        assert driver.trigger() == _tagged(other, more)  # the other topic goes on
        assert driver.offset[topic] == {"0": 10}  # held
        assert driver.trigger() == {}  # one warning per event, not per trigger
        deleted = [r for r in caplog.records if "were deleted while the query read them" in r.getMessage()]
        assert len(deleted) == 1 and topic in deleted[0].getMessage()

        own_broker.create_topic(topic, 3)
        second = produce_per_partition(own_broker, topic, [4, 2, 0], tag="new")
        assert driver.trigger() == _tagged(topic, second)  # every record of the new topic, once
        assert driver.offset[topic] == {"0": 4, "1": 2, "2": 0}
        assert driver.trigger() == {}
        report = driver.reader.reportLatestOffset()
        assert report is not None and report[DATA_LOSS_KEY]["events"] == 2  # deleted, recreated
        assert report[DATA_LOSS_KEY]["skippedOffsets"] == {}  # none that could be counted
        messages = [r.getMessage() for r in caplog.records if "failOnDataLoss=false" in r.getMessage()]
        assert len(messages) == 2 and any("created again" in m or "the log ends at" in m for m in messages)
    finally:
        driver.close()


class FakeClock:
    """The reader's wall clock, moved by the test only."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.kafka
def test_min_offsets_per_trigger_waits_for_records_or_max_trigger_delay(
    kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str]
) -> None:
    """Spark's rule: no batch while fewer than minOffsetsPerTrigger new offsets are available,
    unless maxTriggerDelay has passed since the last batch (the clock is the test's)."""
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 2)
    driver = Driver(kafka_broker, subscribe=topic, startingOffsets="earliest", minOffsetsPerTrigger="5",
                    maxTriggerDelay="1m")
    clock = driver.reader.clock = FakeClock()
    try:
        first = produce_per_partition(kafka_broker, topic, [1, 1], tag="a")
        assert driver.trigger() == _tagged(topic, first)  # the first trigger is never held (as Spark)

        second = produce_per_partition(kafka_broker, topic, [2, 1], tag="b")
        assert driver.trigger() == {}  # 3 new offsets < 5
        clock.now += 59.999
        assert driver.trigger() == {}  # still within the delay

        third = produce_per_partition(kafka_broker, topic, [0, 2], tag="c")
        assert driver.trigger() == _tagged(topic, {**second, **third})  # 5 new offsets: a batch now

        clock.now += 30
        fourth = produce_per_partition(kafka_broker, topic, [1, 0], tag="d")
        assert driver.trigger() == {}
        clock.now += 30  # a minute since the last batch: the delay has passed
        assert driver.trigger() == _tagged(topic, fourth)
        assert driver.offset == {topic: {"0": 4, "1": 4}}  # every record, once
    finally:
        driver.close()


@pytest.mark.kafka
def test_idle_triggers_ask_the_cluster_at_most_once_per_idle_poll_interval(
    kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str]
) -> None:
    """After a trigger that found nothing new, the next waits out the rest of idlePollInterval
    since the last ask (the clock and the sleep are the test's); never while records arrive."""
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 1)
    first = produce_per_partition(kafka_broker, topic, [3], tag="a")
    driver = Driver(kafka_broker, subscribe=topic, startingOffsets="earliest", idlePollInterval="100ms")
    clock = driver.reader.monotonic = FakeClock()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(round(seconds, 6))
        clock.now += seconds

    driver.reader.sleep = sleep
    try:
        assert driver.trigger() == _tagged(topic, first) and slept == []
        assert driver.trigger() == {} and slept == []  # the trigger before found records: no wait
        clock.now += 0.03
        assert driver.trigger() == {} and slept == [0.07]  # idle: the rest of the 100 ms
        clock.now += 0.5
        assert driver.trigger() == {} and slept == [0.07]  # idle, but the interval has passed
        second = produce_per_partition(kafka_broker, topic, [2], tag="b")
        assert driver.trigger() == _tagged(topic, second) and slept == [0.07, 0.1]  # seen after the wait
        assert driver.trigger() == {} and slept == [0.07, 0.1]  # records came: the next one asks at once

        driver.reader.prepareForTriggerAvailableNow()
        assert driver.trigger() == {} and driver.trigger() == {} and slept == [0.07, 0.1]  # availableNow
    finally:
        driver.close()

    off = Driver(kafka_broker, subscribe=topic, startingOffsets="earliest", idlePollInterval="0")
    off.reader.monotonic, off.reader.sleep = FakeClock(), sleep
    try:
        assert off.trigger() == _tagged(topic, {**first, **second})
        assert off.trigger() == {} and off.trigger() == {} and slept == [0.07, 0.1]  # 0: never waits
    finally:
        off.close()


def _batch(spark: SparkSession, broker: TansuBroker, topic: str, **options: Any) -> DataFrame:
    reader = spark.read.format(FORMAT_NAME).option("kafka.bootstrap.servers", broker.bootstrap_servers)
    reader = reader.option("subscribe", topic)
    for name, value in options.items():
        reader = reader.option(name, value if isinstance(value, str) else json.dumps(value))
    return reader.load()


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.parametrize("catalog_spec", ["sqlite"], indirect=True)
def test_batch_read_backfills_a_lakestep_table(
    kafka_spark: SparkSession, kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str], catalog_spec: Any
) -> None:
    """spark.read of [startingOffsets, endingOffsets) (earliest / latest by default, as Spark),
    written into a lakestep table by one idempotent batch write: exact records, once."""
    import pyarrow as pa

    from lakestep.streaming import register

    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 3)
    expected = produce_per_partition(kafka_broker, topic, [5, 3, 0])

    everything = _batch(kafka_spark, kafka_broker, topic)
    assert keyed(everything.collect()) == expected
    ranged = _batch(kafka_spark, kafka_broker, topic, startingOffsets={topic: {"0": 1, "1": -2, "2": -2}},
                    endingOffsets={topic: {"0": 4, "1": -1, "2": -1}})
    assert keyed(ranged.collect()) == {(p, o): v for (p, o), v in expected.items() if p != 0 or 1 <= o < 4}
    split = _batch(kafka_spark, kafka_broker, topic, minPartitions="4")
    assert split.rdd.getNumPartitions() >= 4 and keyed(split.collect()) == expected  # (at least, as Spark)
    capped = _batch(kafka_spark, kafka_broker, topic, maxRecordsPerPartition="2")  # 5 -> 1+2+2, 3 -> 1+2
    assert capped.rdd.getNumPartitions() == 5 and keyed(capped.collect()) == expected
    with pytest.raises(Exception, match="'endingOffsets' cannot be earliest"):
        _batch(kafka_spark, kafka_broker, topic, endingOffsets="earliest").collect()
    with pytest.raises(Exception, match="'startingOffsets' cannot be latest"):
        _batch(kafka_spark, kafka_broker, topic, startingOffsets="latest").collect()
    with pytest.raises(Exception, match="beyond the end of the log"):
        _batch(kafka_spark, kafka_broker, topic, endingOffsets={topic: {"0": 6, "1": -1, "2": -1}}).collect()

    cat = catalog_spec.open()
    try:
        cat.create_namespace("k")
        table = cat.create_table(
            "k.events", pa.schema([("partition", pa.int32()), ("offset", pa.int64()), ("value", pa.binary())])
        )
        register(kafka_spark)
        rows = everything.select("partition", "offset", "value")
        for _ in range(2):  # the second write is a replay of the same (job, batchId): no second commit
            (rows.write.format("lakestep").option("catalog", catalog_spec.url).option("table", "k.events")
             .option("job", "kafka-backfill").option("batchId", "0").mode("append").save())
        written = table.refresh().to_arrow().to_pylist()
        assert len(written) == len(expected)
        assert {(r["partition"], r["offset"]): r["value"] for r in written} == expected
        assert [(h.job_id, h.batch_id) for h in table.history()][:1] == [("kafka-backfill", 0)]
    finally:
        cat.close()


@pytest.mark.kafka
def test_subscribe_pattern_picks_up_a_new_matching_topic(
    kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str]
) -> None:
    """A topic created mid-stream that matches subscribePattern is read from its start at the
    next trigger; one that does not match is not read."""
    prefix = kafka_topic_name()
    first, later, unrelated = f"{prefix}-a", f"{prefix}-b", f"{prefix}x-c"
    kafka_broker.create_topic(first, 2)
    records = produce_per_partition(kafka_broker, first, [2, 1], tag="a")
    driver = Driver(kafka_broker, subscribePattern=f"{re.escape(prefix)}-.*", startingOffsets="earliest")
    try:
        assert driver.trigger() == _tagged(first, records)
        kafka_broker.create_topic(later, 3)
        kafka_broker.create_topic(unrelated, 1)
        new = produce_per_partition(kafka_broker, later, [1, 0, 3], tag="b")
        produce_per_partition(kafka_broker, unrelated, [2], tag="c")
        more = produce_per_partition(kafka_broker, first, [0, 2], tag="a2")
        assert driver.trigger() == {**_tagged(later, new), **_tagged(first, more)}
        assert driver.offset == {first: {"0": 2, "1": 3}, later: {"0": 1, "1": 0, "2": 3}}
        assert driver.trigger() == {}
    finally:
        driver.close()


@pytest.mark.kafka
def test_subscribe_pattern_follows_a_topic_recreated_with_more_partitions(
    own_broker: TansuBroker, kafka_topic_name: Callable[[], str]
) -> None:
    """subscribePattern, failOnDataLoss=false: a matching topic deleted and created again with
    more partitions is read from the start of its new log, every partition, exactly once."""
    prefix = kafka_topic_name()
    topic, other = f"{prefix}-t", f"{prefix}-u"
    own_broker.create_topic(topic, 1)
    own_broker.create_topic(other, 1)
    old = produce_per_partition(own_broker, topic, [3], tag="old")
    driver = Driver(own_broker, subscribePattern=f"{re.escape(prefix)}-.*", startingOffsets="earliest",
                    failOnDataLoss="false")
    try:
        assert driver.trigger() == _tagged(topic, old)
        driver.delete_topic(own_broker, topic)
        kept = produce_per_partition(own_broker, other, [2], tag="u")
        assert driver.trigger() == _tagged(other, kept)
        own_broker.create_topic(topic, 3)
        new = produce_per_partition(own_broker, topic, [1, 2, 4], tag="new")
        assert driver.trigger() == _tagged(topic, new)
        assert driver.offset == {topic: {"0": 1, "1": 2, "2": 4}, other: {"0": 2}}
        assert driver.trigger() == {}
    finally:
        driver.close()


@pytest.mark.kafka
def test_assign_reads_only_its_partitions_of_a_recreated_topic(
    own_broker: TansuBroker, kafka_topic_name: Callable[[], str]
) -> None:
    """assign, failOnDataLoss=false: a topic deleted and created again with more partitions is
    read from the start of its new log, in the assigned partitions only."""
    topic = kafka_topic_name()
    own_broker.create_topic(topic, 3)
    old = produce_per_partition(own_broker, topic, [2, 2, 2], tag="old")
    driver = Driver(own_broker, assign=json.dumps({topic: [0, 2]}), startingOffsets="earliest",
                    failOnDataLoss="false")
    try:
        assert driver.trigger() == _tagged(topic, {k: v for k, v in old.items() if k[0] in (0, 2)})
        driver.delete_topic(own_broker, topic)
        assert driver.trigger() == {}
        own_broker.create_topic(topic, 4)
        new = produce_per_partition(own_broker, topic, [1, 3, 1, 2], tag="new")
        assert driver.trigger() == _tagged(topic, {k: v for k, v in new.items() if k[0] in (0, 2)})
        assert driver.offset == {topic: {"0": 1, "2": 1}}
        assert driver.trigger() == {}
    finally:
        driver.close()


def _produce_at(broker: TansuBroker, topic: str, partition: int, stamps: list[int]) -> dict[tuple[int, int], bytes]:
    """Records with the given create timestamps (ms), in order; {(partition, offset): value}."""
    values = [f"{partition}@{ts}#{i}".encode() for i, ts in enumerate(stamps)]
    placed = broker.produce(topic, values, partition=partition, timestamps=stamps)
    return {(p, offset): v for (p, offset), v in zip(placed, values)}


@pytest.mark.kafka
def test_starting_offsets_by_timestamp(kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str]) -> None:
    """startingTimestamp / startingOffsetsByTimestamp: the first record at or after the timestamp
    (found from the records' own timestamps: tansu answers every timestamp lookup with 0);
    startingOffsetsByTimestampStrategy says what happens where there is none; batch reads
    take endingTimestamp too."""
    from lakestep.streaming.kafka.errors import KafkaTimestampNotFoundError
    from lakestep.streaming.kafka.source import KafkaBatchReader

    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 2)
    stamps = {0: [1000 * (i + 1) for i in range(10)], 1: [500, 5000, 5000, 9000]}
    records = {**_produce_at(kafka_broker, topic, 0, stamps[0]), **_produce_at(kafka_broker, topic, 1, stamps[1])}
    assert sorted(records) == [(0, o) for o in range(10)] + [(1, o) for o in range(4)]

    def first_at(partition: int, ts: int) -> int | None:
        return next((o for o, t in enumerate(stamps[partition]) if t >= ts), None)

    driver = Driver(kafka_broker, subscribe=topic, startingTimestamp="5000")
    try:
        client = driver.reader.client
        for partition, ends in ((0, 10), (1, 4)):
            for ts in (0, 500, 501, 999, 1000, 1001, 4999, 5000, 5001, 9000, 10000, 10001):
                assert client.offset_for_timestamp((topic, partition), ts, 0, ends) == first_at(partition, ts), ts
        assert driver.offset == {topic: {"0": 4, "1": 1}}
        assert driver.trigger() == _tagged(topic, {(p, o): v for (p, o), v in records.items()
                                                   if o >= {0: 4, 1: 1}[p]})
    finally:
        driver.close()

    by_partition = json.dumps({topic: {"0": 10001, "1": 600}})
    with pytest.raises(KafkaTimestampNotFoundError, match=f"topic '{topic}' partition 0 .* 10001") as info:
        Driver(kafka_broker, subscribe=topic, startingOffsetsByTimestamp=by_partition).close()
    assert (info.value.topic, info.value.partition, info.value.timestamp) == (topic, 0, 10001)
    driver = Driver(kafka_broker, subscribe=topic, startingOffsetsByTimestamp=by_partition,
                    startingOffsetsByTimestampStrategy="latest")
    try:
        assert driver.offset == {topic: {"0": 10, "1": 1}}  # no record at 10001 in partition 0: its end
    finally:
        driver.close()

    batch = KafkaBatchReader(KafkaSourceOptions.from_options(
        {"kafka.bootstrap.servers": kafka_broker.bootstrap_servers, "subscribe": topic,
         "startingTimestamp": "2000", "endingTimestamp": "9000"}, batch=True))
    assert batch.ranges() == [((topic, 0), 1, 8), ((topic, 1), 1, 3)]


@pytest.mark.kafka
def test_batch_ranges_refuse_or_clip_offsets_outside_the_log(
    kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    """Batch reads: endingOffsets beyond the end of the log is data loss (failOnDataLoss=false:
    read up to the end, with a warning); a start after the end, or JSON that does not name
    every partition, is refused."""
    from lakestep.streaming.kafka.source import KafkaBatchReader

    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 2)
    produce_per_partition(kafka_broker, topic, [4, 2])

    def ranges(**options: str) -> list[tuple[tuple[str, int], int, int]]:
        opts = {"kafka.bootstrap.servers": kafka_broker.bootstrap_servers, "subscribe": topic, **options}
        return KafkaBatchReader(KafkaSourceOptions.from_options(opts, batch=True)).ranges()

    assert ranges() == [((topic, 0), 0, 4), ((topic, 1), 0, 2)]
    beyond = json.dumps({topic: {"0": 9, "1": -1}})
    with pytest.raises(KafkaDataLossError, match=f"{topic}-0: option 'endingOffsets' \\(9\\) is beyond the end"):
        ranges(endingOffsets=beyond)
    caplog.set_level(logging.WARNING, logger="lakestep.streaming.kafka")
    assert ranges(endingOffsets=beyond, failOnDataLoss="false") == [((topic, 0), 0, 4), ((topic, 1), 0, 2)]
    assert any("beyond the end" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match=f"{topic}-0: option 'startingOffsets' \\(3\\) is after option 'endingOffsets' \\(1\\)"):
        ranges(startingOffsets=json.dumps({topic: {"0": 3, "1": 0}}), endingOffsets=json.dumps({topic: {"0": 1, "1": 2}}))
    with pytest.raises(ValueError, match="'endingOffsets' must list every partition.*missing \\[\\('.*', 1\\)\\]"):
        ranges(endingOffsets=json.dumps({topic: {"0": 1}}))
