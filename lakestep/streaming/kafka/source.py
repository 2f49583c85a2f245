"""The Spark side: the ``lakestep-kafka`` data source and its stream reader."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.types import StructType

from ..compat import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
    check_session,
    require,
)
from ..executors import freeze_worker_heap
from .consumer_config import redact
from .errors import KafkaDataLossError, KafkaOptionError, KafkaTimestampNotFoundError, KafkaTopicNotFoundError
from .offsets import OffsetClient, offsets_from_json, offsets_to_json, rate_limit, split_ranges
from .options import (
    EARLIEST,
    FORMAT_NAME,
    LATEST,
    TP,
    KafkaSourceOptions,
    Offsets,
    StartingOffsets,
    check_common_options,
)
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


_FAIL_ON_DATA_LOSS_HINT = (
    "Some data may have been lost: offsets the query has not read are no longer in Kafka "
    "(retention, a topic deleted or recreated, a broker that lost data). To continue from "
    "the offsets that are there instead, set the option failOnDataLoss=false"
)
#: Key of the data-loss accounting in the reported latest offset (``$`` is never in a topic name).
DATA_LOSS_KEY = "$dataLoss"


class DataLoss:
    """``failOnDataLoss``: raise (``true``, the default), or log one warning per event and
    count the offsets skipped per partition (``false``), for this run of the query.

    The counts are in every progress report of the query, in the source's
    ``latestOffset`` under ``"$dataLoss"``: ``{"events": n, "skippedOffsets":
    {"topic": {"partition": count}}}``. Events whose loss cannot be counted (a
    topic deleted, or recreated: its old offsets not read yet are unknown) count
    as events only.
    """

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.events = 0
        self.skipped: Offsets = {}

    def report(self, message: str, skipped: Mapping[TP, int] | None = None) -> None:
        """Raises:
            KafkaDataLossError: with ``failOnDataLoss=true``."""
        if self.fail:
            raise KafkaDataLossError(f"{message}. {_FAIL_ON_DATA_LOSS_HINT}")
        self.events += 1
        counted = {tp: n for tp, n in (skipped or {}).items() if n > 0}
        for tp, n in counted.items():
            self.skipped[tp] = self.skipped.get(tp, 0) + n
        logger.warning(
            "%s; continuing (failOnDataLoss=false): %s", message,
            f"{sum(counted.values())} offset(s) skipped in {sorted(counted)}" if counted else "offsets skipped unknown",
        )

    def to_json(self) -> dict[str, Any]:
        return {"events": self.events, "skippedOffsets": offsets_to_json(self.skipped)}


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver; reads partitions on executors.

    On the driver (Spark's long-lived Python process for the query) it keeps
    two kafka-python consumers, created lazily and never pickled: one for
    metadata, one for high-watermark probes. ``read()`` runs in executors and
    opens its own consumer per task.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self._client: OffsetClient | None = None
        self._known_end: Offsets = {}
        self._target: Offsets | None = None
        self.data_loss = DataLoss(options.fail_on_data_loss)
        self._gone: set[TP] = set()
        #: partitions whose log was reset (recreated topic): (offset in the old log, where to read from)
        self._restart_at: dict[TP, tuple[int, int]] = {}
        #: wall clock in seconds, for ``maxTriggerDelay`` (a test puts its own clock here)
        self.clock: Callable[[], float] = time.time
        #: when the last batch was planned (0: never, so the first trigger is not delayed, as in Spark)
        self._last_trigger_ms = 0.0
        #: ``idlePollInterval``: a monotonic clock in seconds and a sleep (a test puts its own here)
        self.monotonic: Callable[[], float] = time.monotonic
        self.sleep: Callable[[float], None] = time.sleep
        #: when the cluster was last asked for offsets, and whether that found nothing new
        self._last_probe_s: float | None = None
        self._idle = False

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    # ---------------------------------------------------------------- driver

    @property
    def client(self) -> OffsetClient:
        if self._client is None:
            logger.debug("connecting with %s", redact(self.options.consumer_config))
            self._client = OffsetClient(self.options.consumer_config, self.options.fetch_offset_timeout_ms)
        return self._client

    def _ends(self, start: Mapping[TP, int]) -> Offsets:
        """High watermarks of the partitions in ``start``, probed from the furthest
        offset known to be in the log."""
        probe_from = {tp: max(off, self._known_end.get(tp, off)) for tp, off in start.items()}
        ends = self.client.high_watermarks(probe_from)
        self._known_end.update(ends)
        return ends

    def current_partitions(self, *, force: bool = False) -> list[TP]:
        """The partitions the query reads now, see :func:`current_partitions`."""
        return current_partitions(self.client, self.options, force=force)

    def initialOffset(self) -> dict[str, dict[str, int]]:
        """Resolve ``startingOffsets`` against the cluster."""
        tps = self.current_partitions(force=True)
        require_all(self.client, self.options, tps)
        earliest = self.client.earliest(tps)
        result = resolve_start(self.client, self.options, tps, earliest, lambda: self._ends(earliest))
        logger.info("initial offsets %s", offsets_to_json(result))
        return offsets_to_json(result)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Freeze the end of every current partition: an availableNow query reads
        up to here and stops."""
        tps = self.current_partitions(force=True)
        self._target = self._ends(self.client.earliest(tps))
        logger.info("availableNow target offsets %s", offsets_to_json(self._target))

    def _note_gone(self, begin: Mapping[TP, int], tps: Sequence[TP]) -> None:
        """Partitions the query read that are not in the metadata any more (their topic
        was deleted): a data-loss event, once per partition."""
        present = set(tps)
        gone = sorted(tp for tp in begin if tp not in present and tp not in self._gone)
        if self.options.pattern is not None:  # a topic that stopped matching is not gone
            gone = [tp for tp in gone if self.options.pattern.fullmatch(tp[0])]
        self._gone = {tp for tp in self._gone if tp not in present}
        if gone:
            topics = sorted({t for t, _ in gone})
            self.data_loss.report(
                f"topic(s) {', '.join(map(repr, topics))} (partitions {gone}) were deleted while the "
                "query read them; records not read yet are lost"
            )
            self._gone.update(gone)

    def _note_recreated(self, begin: Mapping[TP, int], origin: dict[TP, int]) -> None:
        """Topics whose id changed since the last trigger: their logs start again; read
        them from their new start."""
        recreated = sorted(self.client.recreated)
        self.client.recreated.clear()
        tps = [tp for tp in begin if tp[0] in recreated and tp in origin]
        if not tps:
            return
        self.data_loss.report(
            f"topic(s) {', '.join(map(repr, recreated))} were deleted and created again while the query "
            "read them; records of the old topic not read yet are lost"
        )
        earliest = self.client.earliest(tps)
        for tp in tps:
            self._restart_at[tp] = (begin[tp], earliest[tp])
            origin[tp] = earliest[tp]
            self._known_end.pop(tp, None)

    def _wait_while_idle(self) -> None:
        """``idlePollInterval``: after a trigger that found nothing new, the next one asks the
        cluster no sooner than this after the last ask. Spark runs a no-data trigger every
        ``spark.sql.streaming.pollingDelay`` (10 ms) with the default trigger; each asks the
        cluster for metadata and high watermarks. New records are seen at most this late."""
        interval_s = self.options.idle_poll_interval_ms / 1000
        if self._idle and self._last_probe_s is not None and self._target is None and interval_s > 0:
            left = self._last_probe_s + interval_s - self.monotonic()
            if left > 0:
                self.sleep(min(left, interval_s))
        self._last_probe_s = self.monotonic()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        """End offsets of the next micro-batch (``start`` if there is nothing new)."""
        self._wait_while_idle()
        end = self._latest_offset(start, limit)
        self._idle = end == start
        return end

    def _latest_offset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        begin = offsets_from_json(start)
        self._restart_at.clear()  # (for the batch planned last; a new one is being planned)
        tps = self.current_partitions(force=True)  # metadata every trigger, as Spark's source
        self._note_gone(begin, tps)
        new = [tp for tp in tps if tp not in begin]
        if self._target is not None:
            new = [tp for tp in new if tp in self._target]
        origin = dict(begin)
        origin.update(self.client.earliest(new))
        self._note_recreated(begin, origin)
        ends = self._ends({tp: origin[tp] for tp in tps if tp in origin})
        if not self.data_loss.fail:  # deleted by retention: not read, so not counted against the limit
            for tp, log_start in self.client.log_starts.items():
                if tp in origin and origin[tp] < log_start:
                    origin[tp] = log_start
        self.client.log_starts.clear()
        until: Offsets = {}
        for tp, offset in origin.items():
            end = ends.get(tp)
            if end is None:  # not read any more (deleted, or no longer matching): hold it
                until[tp] = begin.get(tp, offset)
                continue
            if end < offset:
                self.data_loss.report(
                    f"{tp[0]}-{tp[1]}: the log ends at {end} but the query already read up to {offset}; "
                    "the topic was recreated or the broker lost data"
                )
                log_start = self.client.earliest([tp])[tp]
                self._restart_at[tp] = (begin.get(tp, offset), log_start)
                origin[tp] = offset = log_start
            if self._target is not None:
                end = max(offset, min(end, self._target.get(tp, offset)))
            until[tp] = end
        if self._delay_batch(origin, until):
            return start
        if isinstance(limit, ReadMaxRows):
            until = rate_limit(origin, until, limit.max_rows)
        return offsets_to_json(until)

    def _delay_batch(self, origin: Mapping[TP, int], until: Mapping[TP, int]) -> bool:
        """``minOffsetsPerTrigger`` (Spark's rule): no batch while fewer new offsets than
        that are available, unless ``maxTriggerDelay`` has passed since the last batch.
        Never with ``trigger(availableNow=True)`` (it would hold back the last batch), nor
        when a partition's log was reset (that is handled in the batch planned now)."""
        minimum = self.options.min_offsets_per_trigger
        if minimum is None or self._target is not None or self._restart_at:
            return False
        now_ms = self.clock() * 1000
        if now_ms - self._last_trigger_ms >= self.options.max_trigger_delay_ms:
            self._last_trigger_ms = now_ms
            return False
        available = sum(max(end - origin.get(tp, end), 0) for tp, end in until.items())
        if available < minimum:
            logger.debug("batch delayed: %d new offsets, minOffsetsPerTrigger=%d", available, minimum)
            return True
        self._last_trigger_ms = now_ms
        return False

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The newest offsets seen (for the query's progress), and the data-loss accounting
        of ``failOnDataLoss=false`` under ``"$dataLoss"`` once there was any."""
        report: dict[str, Any] = offsets_to_json(self._known_end)
        if self.data_loss.events:
            report[DATA_LOSS_KEY] = self.data_loss.to_json()
        return report or None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One input partition per Kafka partition with offsets in ``[start, end)``
        (or consecutive pieces of it, see ``minPartitions``).

        Offsets no longer in the log (retention), partitions that do not start at 0
        when discovered, and logs that were reset are data loss (``failOnDataLoss``)."""
        begin = offsets_from_json(start)
        until = offsets_from_json(end)
        moving = [tp for tp in sorted(until) if tp not in begin or until[tp] != begin[tp]]
        log_start = self.client.earliest(moving)
        ranges: list[tuple[TP, int, int]] = []
        for tp in moving:
            stop, first = until[tp], begin.get(tp)
            if tp not in log_start:
                continue  # gone between planning and now; the next trigger reports it
            if first is None:  # discovered while the query runs
                first = log_start[tp]
                if first != 0:
                    self.data_loss.report(
                        f"{tp[0]}-{tp[1]}: a partition found while the query runs starts at offset {first}, "
                        "not 0", {tp: first}
                    )
            elif tp in self._restart_at and self._restart_at[tp][0] == first:
                first = self._restart_at.pop(tp)[1]  # reported when planned
            elif stop < first:  # (a batch planned before a restart of the query)
                self.data_loss.report(
                    f"{tp[0]}-{tp[1]}: the batch ends at {stop}, before its start {first}; the topic "
                    "was recreated or the broker lost data"
                )
                first = log_start[tp]
            elif first < log_start[tp]:
                kept = min(log_start[tp], stop)
                self.data_loss.report(
                    f"{tp[0]}-{tp[1]}: offsets [{first}, {log_start[tp]}) were deleted from the log "
                    "(retention) before the query read them", {tp: kept - first}
                )
                first = kept
            ranges.append((tp, first, stop))
        return [
            KafkaInputPartition(tp[0], tp[1], first, stop)
            for tp, first, stop in split_ranges(ranges, self.options.min_partitions,
                                             self.options.max_records_per_partition)
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
        freeze_worker_heap()
        return read_partition_range(
            self.options, partition.topic, partition.partition, partition.start, partition.end
        )


def current_partitions(client: OffsetClient, o: KafkaSourceOptions, *, force: bool = False) -> list[TP]:
    """The partitions a query reads now (``subscribe``: of its topics; ``subscribePattern``:
    of the topics matching now; ``assign``: the assigned ones that exist)."""
    if o.pattern is not None:
        topics = [t for t in client.all_topics(force=force) if o.pattern.fullmatch(t)]
        return client.partitions(topics, force=force, missing_ok=True)
    tps = client.partitions(o.topics, force=force, missing_ok=True)
    if o.assign is not None:
        present = set(tps)
        return [tp for tp in o.assign if tp in present]
    return tps


def require_all(client: OffsetClient, o: KafkaSourceOptions, tps: Sequence[TP]) -> None:
    """At start: every subscribed topic / assigned partition exists."""
    if o.pattern is None and client.missing:
        name = "assign" if o.assign is not None else "subscribe"
        raise KafkaTopicNotFoundError(
            f"option {name!r}: topic(s) {', '.join(map(repr, client.missing))} do not exist "
            f"on {','.join(o.consumer_config['bootstrap_servers'])}"
        )
    if o.assign is not None and len(tps) != len(o.assign):
        raise KafkaTopicNotFoundError(
            f"option 'assign': partition(s) {sorted(set(o.assign) - set(tps))} do not exist"
        )


def resolve_offsets(
    spec: StartingOffsets, name: str, tps: Sequence[TP], earliest: Mapping[TP, int], latest: Callable[[], Offsets]
) -> Offsets:
    """``startingOffsets`` / ``endingOffsets`` (``name``) as offsets of ``tps``; ``latest``
    is called only when needed.

    Raises:
        KafkaOptionError: JSON offsets that do not name every partition of ``tps``.
    """
    if spec == "earliest":
        return {tp: earliest[tp] for tp in tps}
    if spec == "latest":
        return dict(latest())
    assert isinstance(spec, dict)
    missing = sorted(set(tps) - set(spec))
    extra = sorted(set(spec) - set(tps))
    if missing or extra:
        raise KafkaOptionError(
            f"option {name!r} must list every partition of the subscribed topics "
            f"(use -2 for earliest, -1 for latest); missing {missing}, unknown {extra}",
            option=name
        )
    ends = latest() if LATEST in spec.values() else {}
    return {
        tp: earliest[tp] if spec[tp] == EARLIEST else ends[tp] if spec[tp] == LATEST else spec[tp] for tp in tps
    }


def resolve_timestamps(
    client: OffsetClient,
    spec: int | Mapping[TP, int],
    name: str,
    tps: Sequence[TP],
    earliest: Mapping[TP, int],
    latest: Callable[[], Offsets],
    strategy: str,
) -> Offsets:
    """Offsets of ``tps`` from timestamps (one for all, or one per partition): the first record
    at or after the timestamp (:meth:`OffsetClient.offset_for_timestamp`); where there is none,
    the end of the log (``strategy`` ``latest``) or :class:`KafkaTimestampNotFoundError`.

    Raises:
        KafkaOptionError: per-partition timestamps that do not name every partition of ``tps``.
    """
    if isinstance(spec, int):
        stamps = {tp: spec for tp in tps}
    else:
        missing, extra = sorted(set(tps) - set(spec)), sorted(set(spec) - set(tps))
        if missing or extra:
            raise KafkaOptionError(
                f"option {name!r} must list every partition of the subscribed topics; missing {missing}, "
                f"unknown {extra}",
                option=name
            )
        stamps = dict(spec)
    ends = latest()
    result: Offsets = {}
    for tp in tps:
        offset = client.offset_for_timestamp(tp, stamps[tp], earliest[tp], ends[tp])
        if offset is None:
            if strategy != "latest":
                raise KafkaTimestampNotFoundError(name, tp[0], tp[1], stamps[tp])
            offset = ends[tp]
        result[tp] = offset
    return result


def resolve_start(
    client: OffsetClient, o: KafkaSourceOptions, tps: Sequence[TP], earliest: Mapping[TP, int],
    latest: Callable[[], Offsets],
) -> Offsets:
    """Where a query starts: ``startingTimestamp`` / ``startingOffsetsByTimestamp`` when given
    (before ``startingOffsets``, as Spark ranks them), else ``startingOffsets``."""
    if o.starting_timestamps is not None:
        name = "startingTimestamp" if isinstance(o.starting_timestamps, int) else "startingOffsetsByTimestamp"
        return resolve_timestamps(client, o.starting_timestamps, name, tps, earliest, latest,
                                  o.starting_timestamp_strategy)
    return resolve_offsets(o.starting_offsets, "startingOffsets", tps, earliest, latest)


class KafkaBatchReader(DataSourceReader):
    """``spark.read``: the offsets ``[startingOffsets, endingOffsets)`` of every partition,
    resolved once on the driver (``earliest`` / ``latest`` by default, as Spark), read by
    one task per partition with offsets (or pieces of it, ``minPartitions``).

    Offsets asked for that are no longer in the log (retention) or not yet in it
    (``endingOffsets`` beyond its end) are data loss: ``failOnDataLoss=false`` reads what
    is there, with a warning.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options

    def ranges(self) -> list[tuple[TP, int, int]]:
        """The offset range ``(tp, start, end)`` of every partition (driver side)."""
        o = self.options
        client = OffsetClient(o.consumer_config, o.fetch_offset_timeout_ms)
        try:
            tps = current_partitions(client, o, force=True)
            require_all(client, o, tps)
            earliest = client.earliest(tps)
            ends: Offsets = {}

            def latest() -> Offsets:
                if not ends:
                    ends.update(client.high_watermarks(earliest))
                return ends

            start = resolve_start(client, o, tps, earliest, latest)
            if o.ending_timestamps is not None:
                end = resolve_timestamps(client, o.ending_timestamps, "endingOffsetsByTimestamp", tps, earliest,
                                         latest, "latest")
            else:
                end = resolve_offsets(o.ending_offsets, "endingOffsets", tps, earliest, latest)
            log_end = latest()
        finally:
            client.close()
        data_loss = DataLoss(o.fail_on_data_loss)
        ranges: list[tuple[TP, int, int]] = []
        for tp in tps:
            first, stop = start[tp], end[tp]
            if first > stop:
                raise KafkaOptionError(
                    f"{tp[0]}-{tp[1]}: option 'startingOffsets' ({first}) is after option 'endingOffsets' ({stop})",
                    option="startingOffsets"
                )
            if stop > log_end[tp]:
                data_loss.report(
                    f"{tp[0]}-{tp[1]}: option 'endingOffsets' ({stop}) is beyond the end of the log ({log_end[tp]})"
                )
                stop = log_end[tp]
            if first < earliest[tp]:
                kept = min(earliest[tp], stop)
                data_loss.report(
                    f"{tp[0]}-{tp[1]}: offsets [{first}, {earliest[tp]}) were deleted from the log (retention)",
                    {tp: kept - first},
                )
                first = kept
            ranges.append((tp, first, max(first, stop)))
        logger.info("batch read of %s", [(f"{t}-{p}", a, b) for (t, p), a, b in ranges])
        return ranges

    def partitions(self) -> Sequence[InputPartition]:
        return [
            KafkaInputPartition(tp[0], tp[1], first, stop)
            for tp, first, stop in split_ranges(self.ranges(), self.options.min_partitions,
                                             self.options.max_records_per_partition)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch] | Iterator[tuple[Any, ...]]:
        assert isinstance(partition, KafkaInputPartition), partition
        freeze_worker_heap()
        return read_partition_range(
            self.options, partition.topic, partition.partition, partition.start, partition.end
        )


class KafkaDataSource(DataSource):
    """The ``lakestep-kafka`` data source: streaming queries and batch reads."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def _options(self) -> KafkaSourceOptions:
        return KafkaSourceOptions.from_options(self.options)

    def schema(self) -> StructType:
        # Spark asks at load(), before it says whether the read is a batch or a stream: the
        # options both have in common are checked here, the others when the reader is made.
        return kafka_schema(check_common_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        require("kafka")  # streams need admission control (4.2); batch reads run from 4.0
        options = self._options()
        _check_schema(schema, options)
        return KafkaStreamReader(options)

    def reader(self, schema: StructType) -> DataSourceReader:
        """``spark.read``: a batch read of ``[startingOffsets, endingOffsets)``."""
        options = KafkaSourceOptions.from_options(self.options, batch=True)
        _check_schema(schema, options)
        return KafkaBatchReader(options)


def _check_schema(schema: StructType, options: KafkaSourceOptions) -> None:
    expected = kafka_schema(options.include_headers)
    if schema != expected:
        raise KafkaOptionError(
            f"{FORMAT_NAME} has a fixed schema and does not accept a user-specified one; "
            f"expected {expected.simpleString()}, got {schema.simpleString()}",
            option="schema"
        )


def register_kafka_source(spark: SparkSession) -> None:
    """Register ``lakestep-kafka`` with ``spark`` (idempotent). (``lakestep-kafka-ingest`` is
    registered by :func:`lakestep.streaming.kafka.ingest`, the only one that starts it.)

    Raises:
        SparkVersionError: before Spark 4.0 (no Python data sources). On 4.0 and 4.1 batch
            reads run, and a streaming query fails as it starts with the same error's
            message (streams need 4.2's admission control: lakestep/streaming/compat.py)."""
    require("format", check_session(spark))
    spark.dataSource.register(KafkaDataSource)
