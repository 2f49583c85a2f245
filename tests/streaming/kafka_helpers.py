"""Helpers shared by the ``lakestep-kafka`` tests: queries in local Spark, and producing
known records to the test broker."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pytest

from lakestep.streaming.kafka.options import FORMAT_NAME
from tests.waiting import wait_until

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


TRIGGER = {"processingTime": "100 milliseconds"}
HANG = 180.0  # a wait that takes longer is a hang, not a slow machine


class Run:
    """One streaming query: ``lakestep-kafka`` -> a lakestep table, and its progress reports
    (all of them: ``recentProgress`` keeps only the last 100)."""

    def __init__(self, spark: SparkSession, broker: TansuBroker, topic: str | None, url: str, checkpoint: Path,
                 trigger: dict[str, Any] = TRIGGER, columns: tuple[str, ...] = ("partition", "offset", "value"),
                 **options: Any) -> None:
        df = stream(spark, broker, topic, startingOffsets="earliest", **options)
        self.query: StreamingQuery = (
            df.select(*columns).writeStream.format("lakestep")
            .option("catalog", url).option("table", "k.events").option("job", "kafka-ingest")
            .option("checkpointLocation", str(checkpoint)).trigger(**trigger).start()
        )
        self._seen: dict[tuple[int, str], Any] = {}

    def progress(self) -> list[Any]:
        """Every progress report so far, oldest first."""
        for p in self.query.recentProgress:
            self._seen[(p["batchId"], p["timestamp"])] = p
        return [self._seen[k] for k in sorted(self._seen, key=lambda k: k[1])]

    def died(self) -> str | None:
        e = self.query.exception()
        return None if e is None else f"the query died ({e})"

    def wait(self, cond: Callable[[], Any], what: str) -> Any:
        return wait_until(cond, what, timeout=HANG, interval=0.1, failed=self.died,
                          detail=lambda: f"status {self.query.status}, last progress {self.query.lastProgress}")

    def batches(self) -> list[Any]:
        """Reports of triggers that ran a batch (empty or not)."""
        return [p for p in self.progress() if "addBatch" in p["durationMs"]]

    def data(self, rows: int) -> list[Any]:
        """Reports of the batches that read records, once they read ``rows`` in all (else empty)."""
        batches = [p for p in self.batches() if p["numInputRows"]]
        return batches if sum(p["numInputRows"] for p in batches) >= rows else []

    def held(self, ends: dict[str, dict[str, int]]) -> list[Any]:
        """Reports of triggers that ran no batch although the source had seen the offsets ``ends``."""
        return [p for p in self.progress() if "addBatch" not in p["durationMs"]
                and json.loads(p["sources"][0]["latestOffset"]) == ends]

    def stop(self) -> None:
        self.query.stop()


def progress_ms(timestamp: str) -> int:
    """A progress report's timestamp (``2026-01-02T03:04:05.678Z``) in epoch milliseconds."""
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)
