"""``minOffsetsPerTrigger`` / ``maxTriggerDelay`` of ``lakestep-kafka`` in whole Spark queries
(issue 15): the real tansu broker, the shared Spark session, a lakestep table as the sink.

The reader harness of test_kafka_parity.py moves a fake clock; here the clock is the real
one, so nothing is asserted about how soon anything happens. What the tests wait for are
conditions (the query's progress reports, the table's rows), with generous limits that only
catch a hang; the one figure about time is a lower bound (a batch held by
``maxTriggerDelay`` is planned at least that long after the previous one), which load can
only make truer.

The queries run in the ``every_trigger`` session (conftest.py), whose progress reports
every trigger, also the ones that plan no batch: counting those is how a test knows the
source was asked and held the records back.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa
import pytest

from tests.streaming.kafka_helpers import Run, produce_per_partition, progress_ms

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestep.catalog import Table
    from lakestep.testing import TansuBroker

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.parametrize("catalog_spec", ["sqlite"], indirect=True)]


def _table(catalog_spec: Any) -> tuple[Any, Table]:
    cat = catalog_spec.open()
    cat.create_namespace("k")
    table = cat.create_table(
        "k.events", pa.schema([("partition", pa.int32()), ("offset", pa.int64()), ("value", pa.binary())])
    )
    return cat, table


def _rows(table: Table) -> dict[tuple[int, int], bytes]:
    return {(r["partition"], r["offset"]): r["value"] for r in table.refresh().to_arrow().to_pylist()}


def _appends(table: Table) -> list[tuple[str | None, int | None, int]]:
    """(job, batch id, rows) of the commits that added rows, oldest first."""
    return [(h.job_id, h.batch_id, h.added_rows) for h in reversed(table.history()) if h.added_rows]


def test_min_offsets_per_trigger_holds_records_until_enough_arrive(
    every_trigger: SparkSession, kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str],
    catalog_spec: Any, tmp_path: Path,
) -> None:
    """Fewer new offsets than minOffsetsPerTrigger (and maxTriggerDelay far away): trigger after
    trigger sees them and plans no batch; once the minimum is there, all of them come in one
    batch, one commit of the table."""
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 2)
    cat, table = _table(catalog_spec)
    run = Run(every_trigger, kafka_broker, topic, catalog_spec.url, tmp_path / "ck",
              minOffsetsPerTrigger=10, maxTriggerDelay="1h")
    try:
        # batch 0: the topic is empty; the first trigger of a run is never held, and starts the delay
        run.wait(lambda: run.batches(), "the first batch")
        first = produce_per_partition(kafka_broker, topic, [4, 2], tag="a")  # 6 < 10
        run.wait(lambda: len(run.held({topic: {"0": 4, "1": 2}})) >= 3, "three triggers that held 6 offsets")
        assert [p["numInputRows"] for p in run.batches()] == [0]
        assert _rows(table) == {}

        second = produce_per_partition(kafka_broker, topic, [1, 3], tag="b")  # 10: the minimum
        run.wait(lambda: run.data(10), "batches of 10 records")
        batches = run.batches()
        assert [(p["batchId"], p["numInputRows"]) for p in batches] == [(0, 0), (1, 10)]
        assert _rows(table) == {**first, **second}
        assert _appends(table) == [("kafka-ingest", 1, 10)]
    finally:
        run.stop()
        cat.close()


def test_max_trigger_delay_releases_fewer_records_than_the_minimum(
    every_trigger: SparkSession, kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str],
    catalog_spec: Any, tmp_path: Path,
) -> None:
    """Fewer new offsets than minOffsetsPerTrigger: they come in one batch once maxTriggerDelay
    has passed since the last batch, and not before (a lower bound from Spark's own clock)."""
    delay_ms = 3000
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 2)
    cat, table = _table(catalog_spec)
    run = Run(every_trigger, kafka_broker, topic, catalog_spec.url, tmp_path / "ck",
              minOffsetsPerTrigger=100, maxTriggerDelay=f"{delay_ms}ms")
    try:
        run.wait(lambda: run.batches(), "the first batch")
        records = produce_per_partition(kafka_broker, topic, [2, 1])
        run.wait(lambda: run.data(3), "batches of 3 records")
        empty, data = run.batches()
        assert (empty["batchId"], empty["numInputRows"], data["batchId"], data["numInputRows"]) == (0, 0, 1, 3)
        assert _rows(table) == records
        assert _appends(table) == [("kafka-ingest", 1, 3)]
        # The delay started in batch 0's planning (after that trigger began) and ended in batch 1's
        # planning (before that trigger ended): so batch 1 ended at least delay_ms after batch 0 began.
        data_end = progress_ms(data["timestamp"]) + data["durationMs"]["triggerExecution"]
        assert data_end - progress_ms(empty["timestamp"]) >= delay_ms
    finally:
        run.stop()
        cat.close()


def test_a_restarted_query_reads_held_records_at_its_first_trigger(
    every_trigger: SparkSession, kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str],
    catalog_spec: Any, tmp_path: Path,
) -> None:
    """The delay is counted by the running query, not kept in the checkpoint (as Spark's): records
    held back when the query stops are read by the first trigger of the next run, in one batch."""
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 1)
    cat, table = _table(catalog_spec)
    options = {"minOffsetsPerTrigger": 100, "maxTriggerDelay": "1h"}
    run = Run(every_trigger, kafka_broker, topic, catalog_spec.url, tmp_path / "ck", **options)
    try:
        run.wait(lambda: run.batches(), "the first batch")
        records = produce_per_partition(kafka_broker, topic, [3])
        run.wait(lambda: len(run.held({topic: {"0": 3}})) >= 2, "two triggers that held 3 offsets")
    finally:
        run.stop()
    assert _rows(table) == {}
    again = Run(every_trigger, kafka_broker, topic, catalog_spec.url, tmp_path / "ck", **options)
    try:
        again.wait(lambda: again.data(3), "batches of 3 records")
        assert [(p["batchId"], p["numInputRows"]) for p in again.batches()] == [(1, 3)]
        assert _rows(table) == records
        assert _appends(table) == [("kafka-ingest", 1, 3)]
    finally:
        again.stop()
        cat.close()


def test_available_now_does_not_hold_its_last_batch(
    every_trigger: SparkSession, kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str],
    catalog_spec: Any, tmp_path: Path,
) -> None:
    """trigger(availableNow=True) reads everything there is and stops: minOffsetsPerTrigger does not
    hold back the rest after the batches maxOffsetsPerTrigger cut (13 records, 10 per batch)."""
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 1)
    records = produce_per_partition(kafka_broker, topic, [13])
    cat, table = _table(catalog_spec)
    run = Run(every_trigger, kafka_broker, topic, catalog_spec.url, tmp_path / "ck", trigger={"availableNow": True},
              minOffsetsPerTrigger=10, maxOffsetsPerTrigger=10, maxTriggerDelay="1h")
    try:
        run.wait(lambda: not run.query.isActive, "the availableNow query to finish")
        assert [(p["batchId"], p["numInputRows"]) for p in run.batches()] == [(0, 10), (1, 3)]
        assert _rows(table) == records
        assert _appends(table) == [("kafka-ingest", 0, 10), ("kafka-ingest", 1, 3)]
    finally:
        run.stop()
        cat.close()
