"""Helpers shared by the ``lakestep-kafka`` tests: queries in local Spark, and producing
known records to the test broker."""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from lakestep.streaming.kafka.options import FORMAT_NAME

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from lakestep.testing import TansuBroker


def stream(spark: SparkSession, broker: TansuBroker, topic: str | None, **options: Any) -> DataFrame:
    """A ``lakestep-kafka`` stream of ``topic`` (``subscribe``; None: the options say what)."""
    reader = spark.readStream.format(FORMAT_NAME).option("kafka.bootstrap.servers", broker.bootstrap_servers)
    if topic is not None:
        reader = reader.option("subscribe", topic)
    for name, value in options.items():
        reader = reader.option(name, value if isinstance(value, str) else json.dumps(value))
    return reader.load()


def memory_query(df: DataFrame, **trigger: Any) -> tuple[StreamingQuery, str]:
    name = f"kafka_{uuid.uuid4().hex[:10]}"
    query = df.writeStream.format("memory").queryName(name).trigger(**trigger).start()
    return query, name


def await_end(query: StreamingQuery, timeout: int = 60) -> None:
    finished = query.awaitTermination(timeout)
    if not finished:
        query.stop()
        pytest.fail(f"query did not finish within {timeout}s: {query.status}")


def batch_sizes(query: StreamingQuery) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]


def keyed(rows: list[Any]) -> dict[tuple[int, int], bytes]:
    return {(r["partition"], r["offset"]): r["value"] for r in rows}


def produce_per_partition(
    broker: TansuBroker, topic: str, counts: list[int], *, tag: str = "v"
) -> dict[tuple[int, int], bytes]:
    """Produce ``counts[p]`` records to partition ``p``; returns {(partition, offset): value}."""
    expected: dict[tuple[int, int], bytes] = {}
    for partition, count in enumerate(counts):
        values = [f"{tag}-{partition}-{i}".encode() for i in range(count)]
        keys = [f"k{i}".encode() for i in range(count)]
        for (p, offset), value in zip(broker.produce(topic, values, partition=partition, keys=keys), values):
            expected[(p, offset)] = value
    return expected
