"""Issue-15 options of ``lakestep-kafka`` in whole Spark queries against the real (tansu)
broker, into a lakestep table: what test_kafka_parity.py drives through the reader alone.

tansu has no CreatePartitions and drops the connection on DeleteRecords, so a topic that
grows and loses offsets at once is made by deleting it and creating it again with more
partitions and fewer records, while the query is stopped (a running query's long-poll
Fetch could create the deleted topic again on tansu; see ``TansuBroker.delete_topic``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa
import pytest

from lakestep.streaming.kafka.source import DATA_LOSS_KEY
from tests.streaming.kafka_helpers import HANG, Run, produce_per_partition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestep.testing import TansuBroker

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.parametrize("catalog_spec", ["sqlite"], indirect=True)]

COLUMNS = ("topic", "partition", "offset", "value")


def _rows(table: Any) -> list[tuple[str, int, int, bytes]]:
    return sorted((r["topic"], r["partition"], r["offset"], r["value"]) for r in table.refresh().to_arrow().to_pylist())


def _expected(topic: str, records: dict[tuple[int, int], bytes]) -> list[tuple[str, int, int, bytes]]:
    return [(topic, p, o, v) for (p, o), v in records.items()]


def test_subscribe_pattern_and_fail_on_data_loss_in_a_query(
    every_trigger: SparkSession, own_broker: TansuBroker, kafka_topic_name: Callable[[], str],
    catalog_spec: Any, tmp_path: Path,
) -> None:
    """subscribePattern: a matching topic created mid-query is read from its start, one that does
    not match is not. A topic recreated with more partitions and fewer records while the query
    was stopped (lost offsets and new partitions at once): with failOnDataLoss left at its
    default (true) the restarted query fails at its first trigger, naming the partition and the
    option, and writes nothing; with failOnDataLoss=false, from the same checkpoint, it reads
    the topic from its new start, every record once, and the event is in its progress."""
    from pyspark.errors import StreamingQueryException

    prefix = kafka_topic_name()
    first, later, unrelated = f"{prefix}-a", f"{prefix}-b", f"{prefix}x-c"
    own_broker.create_topic(first, 1)
    old = produce_per_partition(own_broker, first, [5], tag="old")
    cat = catalog_spec.open()
    cat.create_namespace("k")
    table = cat.create_table("k.events", pa.schema(
        [("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("value", pa.binary())]))
    options: dict[str, Any] = {"subscribePattern": f"{re.escape(prefix)}-.*", "failOnDataLoss": "false",
                               "columns": COLUMNS}
    run = Run(every_trigger, own_broker, None, catalog_spec.url, tmp_path / "ck", **options)
    try:
        run.wait(lambda: run.data(5), "the first 5 records")
        own_broker.create_topic(later, 2)
        own_broker.create_topic(unrelated, 1)
        produce_per_partition(own_broker, unrelated, [2], tag="c")
        found = produce_per_partition(own_broker, later, [2, 1], tag="b")
        run.wait(lambda: run.data(8), "the 3 records of the topic created mid-query")
        assert _rows(table) == sorted(_expected(first, old) + _expected(later, found))
        latest = json.loads(run.progress()[-1]["sources"][0]["latestOffset"])
        assert latest == {first: {"0": 5}, later: {"0": 2, "1": 1}}  # no data loss reported
    finally:
        run.stop()

    own_broker.delete_topic(first)
    own_broker.create_topic(first, 3)
    new = produce_per_partition(own_broker, first, [2, 1, 1], tag="new")  # partition 0 ends at 2 < 5
    strict = Run(every_trigger, own_broker, None, catalog_spec.url, tmp_path / "ck",
                 **{k: v for k, v in options.items() if k != "failOnDataLoss"})
    try:
        with pytest.raises(StreamingQueryException,
                           match=rf"{re.escape(first)}-0: the log ends at 2 but the query already read up to 5.*"
                                 r"failOnDataLoss=false"):
            strict.query.awaitTermination(HANG)  # (a limit for a hang: it fails at its first trigger)
    finally:
        strict.stop()
    assert _rows(table) == sorted(_expected(first, old) + _expected(later, found))  # nothing written
    again = Run(every_trigger, own_broker, None, catalog_spec.url, tmp_path / "ck", **options)
    try:
        again.wait(lambda: again.data(4), "the 4 records of the recreated topic")
        assert _rows(table) == sorted(_expected(first, old) + _expected(later, found) + _expected(first, new))
        assert [p["numInputRows"] for p in again.batches() if p["numInputRows"]] == [4]  # one batch
        latest = json.loads(again.progress()[-1]["sources"][0]["latestOffset"])
        assert latest == {first: {"0": 2, "1": 1, "2": 1}, later: {"0": 2, "1": 1},
                          DATA_LOSS_KEY: {"events": 1, "skippedOffsets": {}}}  # (uncountable: the old log is gone)
    finally:
        again.stop()
        cat.close()


def _produce_at(broker: TansuBroker, topic: str, partition: int, stamps: list[int], tag: str
                ) -> dict[tuple[int, int], bytes]:
    """Records with the given create timestamps (ms), in order; {(partition, offset): value}."""
    values = [f"{tag}-{partition}@{ts}#{i}".encode() for i, ts in enumerate(stamps)]
    placed = broker.produce(topic, values, partition=partition, timestamps=stamps)
    return {(p, offset): v for (p, offset), v in zip(placed, values)}


def test_offsets_by_timestamp_in_queries(
    every_trigger: SparkSession, kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str],
    catalog_spec: Any, tmp_path: Path,
) -> None:
    """Batch: [startingOffsetsByTimestamp, endingTimestamp) into a lakestep table by one idempotent
    write (replayed: no second commit). Stream: startingTimestamp with
    startingOffsetsByTimestampStrategy=latest starts a partition without such a record at its
    end, and reads what comes after; strategy error (the default) fails the query, naming it."""
    from pyspark.errors import StreamingQueryException

    from lakestep.streaming.kafka.options import FORMAT_NAME

    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 2)
    records = {**_produce_at(kafka_broker, topic, 0, [1000, 2000, 3000, 4000, 5000], "a"),
               **_produce_at(kafka_broker, topic, 1, [500, 2500, 2500, 9000], "a")}
    cat = catalog_spec.open()
    cat.create_namespace("k")
    table = cat.create_table("k.events", pa.schema(
        [("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("value", pa.binary())]))
    try:
        df = (every_trigger.read.format(FORMAT_NAME).option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
              .option("subscribe", topic).option("startingOffsetsByTimestamp", json.dumps({topic: {"0": 2000, "1": 501}}))
              .option("endingTimestamp", "4500").load().select(*COLUMNS))
        for _ in range(2):  # the second write replays (job, batchId): no second commit
            (df.write.format("lakestep").option("catalog", catalog_spec.url).option("table", "k.events")
             .option("job", "kafka-backfill").option("batchId", "0").mode("append").save())
        wanted = {(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)}  # >= 2000 / >= 501, and < 4500
        assert _rows(table) == sorted(_expected(topic, {k: v for k, v in records.items() if k in wanted}))
        assert [(h.job_id, h.batch_id, h.added_rows) for h in table.history() if h.added_rows] == [
            ("kafka-backfill", 0, 5)]

        # stream: no record at or after 6000 in partition 0: 'latest' starts it at its end (5)
        run = Run(every_trigger, kafka_broker, topic, catalog_spec.url, tmp_path / "ck", columns=COLUMNS,
                  startingTimestamp="6000", startingOffsetsByTimestampStrategy="latest")
        try:
            run.wait(lambda: run.data(1), "the record at 9000")
            more = produce_per_partition(kafka_broker, topic, [2, 0], tag="b")
            run.wait(lambda: run.data(3), "the records produced while the query runs")
        finally:
            run.stop()
        streamed = {(1, 3): records[(1, 3)], **more}
        assert _rows(table) == sorted(
            _expected(topic, {k: v for k, v in records.items() if k in wanted}) + _expected(topic, streamed))

        never = 4102444800000  # 2100-01-01: no record is that new
        failing = Run(every_trigger, kafka_broker, topic, catalog_spec.url, tmp_path / "ck-error", columns=COLUMNS,
                      startingTimestamp=str(never))
        try:
            with pytest.raises(StreamingQueryException, match=f"topic '{re.escape(topic)}' partition 0 .*{never}"):
                failing.query.awaitTermination(180)  # (a limit for a hang: it fails at its first trigger)
        finally:
            failing.stop()
    finally:
        cat.close()


def test_assign_reads_only_its_partitions_in_a_query(
    every_trigger: SparkSession, kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str],
    catalog_spec: Any, tmp_path: Path,
) -> None:
    """assign (availableNow): the assigned partitions, every record once; the others not at all."""
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 3)
    records = produce_per_partition(kafka_broker, topic, [3, 4, 2])
    cat = catalog_spec.open()
    cat.create_namespace("k")
    table = cat.create_table("k.events", pa.schema(
        [("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("value", pa.binary())]))
    run = Run(every_trigger, kafka_broker, None, catalog_spec.url, tmp_path / "ck", trigger={"availableNow": True},
              columns=COLUMNS, assign={topic: [0, 2]})
    try:
        run.wait(lambda: not run.query.isActive, "the availableNow query to finish")
        assert _rows(table) == sorted(_expected(topic, {k: v for k, v in records.items() if k[0] != 1}))
        assert json.loads(run.progress()[-1]["sources"][0]["endOffset"]) == {topic: {"0": 3, "2": 2}}
    finally:
        run.stop()
        cat.close()
