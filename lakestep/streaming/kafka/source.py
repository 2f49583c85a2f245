"""The Spark side: the ``lakestep-kafka`` data source and its stream reader."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

try:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
    from pyspark.sql.types import StructType
except ImportError as _exc:  # pragma: no cover - depends on the installed pyspark
    raise ImportError(
        "lakestep.streaming.kafka needs pyspark>=4.2 (Python data source admission control); "
        f"import failed: {_exc}"
    ) from _exc

from .errors import KafkaDataLossError
from .offsets import _OffsetClient, offsets_from_json, offsets_to_json, rate_limit, split_ranges
from .options import EARLIEST, FORMAT_NAME, LATEST, TP, KafkaSourceOptions, Offsets, redact
from .reader import read_partition_range
from .schema import kafka_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    """The offsets ``[start, end)`` of one Kafka partition (all of a batch's, or a piece
    with ``minPartitions``): one Spark task."""

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
        """One input partition per Kafka partition with offsets in ``[start, end)``
        (or consecutive pieces of it, see ``minPartitions``)."""
        begin = offsets_from_json(start)
        until = offsets_from_json(end)
        new = [tp for tp in until if tp not in begin]
        if new:
            begin.update(self.client.earliest(new))
        ranges: list[tuple[TP, int, int]] = []
        for tp in sorted(until):
            first, stop = begin[tp], until[tp]
            if stop < first:
                raise KafkaDataLossError(
                    f"{tp[0]}-{tp[1]}: batch end {stop} is before its start {first}"
                )
            ranges.append((tp, first, stop))
        return [
            KafkaInputPartition(tp[0], tp[1], first, stop)
            for tp, first, stop in split_ranges(ranges, self.options.min_partitions)
        ]

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
