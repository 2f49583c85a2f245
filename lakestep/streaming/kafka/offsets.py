"""Offsets: their JSON form in the checkpoint, ``maxOffsetsPerTrigger``, and the
driver-side client that looks up partitions, earliest offsets and high watermarks."""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import InternalError
from . import batches as _batches
from .errors import KafkaDataLossError, KafkaDecodeError, KafkaSourceTimeoutError, KafkaTopicNotFoundError
from .kafka_python import import_kafka_python as _import_kafka_python
from .options import TP, Offsets

if TYPE_CHECKING:
    from kafka import KafkaConsumer, TopicPartition

logger = logging.getLogger(__name__)

_PARTITION_DISCOVERY_INTERVAL_S = 1.0  # metadata at most once a second (Spark: every trigger)
_PROBE_FETCH_WAIT_MS = 10  # tansu never answers a Fetch with max_wait 0 (kafka-python gets nothing)
_PROBE_PARTITION_FETCH_BYTES = 8 * 1024
_PROBE_MAX_RECORDS = 1_000_000  # drain a probe's fetches at once (records are dropped)
_PROBE_STALL_S = 5.0
#: the longest a probe waits for the fetches of its previous call to land (a few max waits)
_IN_FLIGHT_WAIT_S = 5 * _PROBE_FETCH_WAIT_MS / 1000
#: The least time between two Metadata requests of the driver's consumer, unless the user sets
#: kafka.retry.backoff.ms. kafka-python waits out this much after the last request before it sends
#: the next; a query's start asks three times in a row (initialOffset, the availableNow target,
#: the first trigger), and kafka-python 3.0 keeps 100 ms whatever the consumer is given: that was
#: ~90 ms of a trigger's latestOffset (benchmarks.streaming (d)).
_METADATA_BACKOFF_MS = 10


def offsets_to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """Canonical offset dict for Spark: topics and partitions sorted, partition keys as str.

    Spark compares offsets by their JSON text, so the order must be stable.
    """
    result: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        result.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return result


def offsets_from_json(data: Mapping[str, Mapping[str, Any]] | None) -> Offsets:
    """Inverse of :func:`offsets_to_json`."""
    result: Offsets = {}
    for topic, parts in (data or {}).items():
        for partition, offset in parts.items():
            result[(topic, int(partition))] = int(offset)
    return result


def rate_limit(start: Mapping[TP, int], until: Mapping[TP, int], limit: int) -> Offsets:
    """Spark's ``maxOffsetsPerTrigger`` split of ``limit`` records over partitions.

    Each partition with a backlog gets ``limit * backlog / total_backlog``
    records, rounded down, except that shares below one record are rounded up
    so that small partitions are not starved (the total can therefore exceed
    ``limit`` by at most the number of partitions). ``start`` must contain every
    key of ``until``.
    """
    sizes = {tp: end - start[tp] for tp, end in until.items() if end - start[tp] > 0}
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(until)
    result: Offsets = {}
    for tp, end in until.items():
        size = sizes.get(tp)
        if size is None:
            result[tp] = end
            continue
        prorate = limit * (size / total)
        share = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        result[tp] = min(end, start[tp] + int(share))
    return result


def split_ranges(ranges: Sequence[tuple[TP, int, int]], min_partitions: int | None,
                 max_records: int | None = None) -> list[tuple[TP, int, int]]:
    """Spark's split of the non-empty offset ranges ``(tp, start, end)`` into tasks, by
    ``maxRecordsPerPartition`` (``max_records``) and ``minPartitions``, in Spark's order:

    1. With ``max_records``, every range is cut into ``ceil(size / max_records)``
       consecutive pieces of nearly equal size.
    2. If ``min_partitions`` is more than the pieces so far, the pieces whose
       proportional share of ``min_partitions`` rounds to one stay whole, and so
       do all pieces of their topic-partition; the others are cut into
       ``round(size / their_total * (min_partitions - whole_pieces))`` (at least
       one) consecutive pieces.

    Otherwise every range stays whole. As in Spark, the result may hold more
    tasks than ``min_partitions`` (rounding), and a piece of at most
    ``max_records`` offsets may be cut again by step 2.
    """
    ranges = [r for r in ranges if r[2] > r[1]]
    if max_records is not None:
        ranges = [piece for tp, start, end in ranges
                  for piece in _divided(tp, start, end, -(-(end - start) // max_records))]
    if min_partitions is None or len(ranges) >= min_partitions:
        return list(ranges)

    def parts(size: int, total: int, wanted: int) -> int:
        return max(int(math.floor(size / total * wanted + 0.5)), 1)  # Scala's math.round

    total = sum(end - start for _, start, end in ranges)
    whole = [r for r in ranges if parts(r[2] - r[1], total, min_partitions) == 1]
    whole_tps = {tp for tp, _, _ in whole}
    split_total = total - sum(end - start for _, start, end in whole)
    split_wanted = max(min_partitions - len(whole), 1)
    return [piece for tp, start, end in ranges
            for piece in _divided(tp, start, end,
                                  1 if tp in whole_tps else parts(end - start, split_total, split_wanted))]


def _divided(tp: TP, start: int, end: int, count: int) -> list[tuple[TP, int, int]]:
    """``[start, end)`` in ``count`` consecutive non-empty pieces; the last ones take the
    remainder of the division."""
    out: list[tuple[TP, int, int]] = []
    remaining, first = end - start, start
    for part in range(count):
        size = remaining // (count - part)
        remaining -= size
        if size > 0:
            out.append((tp, first, min(first + size, end)))
        first = min(first + size, end)
    return out


# ============================================================================ kafka access


def new_consumer(config: Mapping[str, Any], *, timeout_ms: int, **overrides: Any) -> KafkaConsumer:
    """A group-less, non-committing kafka-python consumer.

    ``timeout_ms`` bounds the initial bootstrap (connection + metadata) unless
    the user set ``kafka.bootstrap.timeout.ms``.
    """
    _import_kafka_python()
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError

    settings = dict(config)
    settings.update(overrides)
    settings.setdefault("bootstrap_timeout_ms", min(30_000, timeout_ms))
    settings.update(
        group_id=None,
        enable_auto_commit=False,
        allow_auto_create_topics=False,
        auto_offset_reset="none",  # never move silently: out-of-range is data loss
    )
    try:
        return KafkaConsumer(**settings)
    except KafkaError as exc:
        raise KafkaSourceTimeoutError(
            f"cannot connect to Kafka at {','.join(settings['bootstrap_servers'])}: {exc!r}"
        ) from exc


def _set_metadata_backoff(consumer: KafkaConsumer, ms: int) -> None:
    """kafka-python 3.0 does not hand ``retry_backoff_ms`` to its cluster metadata, which gates
    Metadata requests with it: set it there (nothing happens if its internals differ)."""
    cluster = getattr(consumer, "_cluster", None)
    config = getattr(cluster, "config", None)
    if isinstance(config, dict) and "retry_backoff_ms" in config:
        config["retry_backoff_ms"] = ms
    else:
        logger.debug("kafka-python's cluster metadata has no retry_backoff_ms: left as it is")


def _drop_earlier_fetches(consumer: KafkaConsumer, until: float) -> None:
    """Let the probe's fetches still in flight from its previous call land, then drop their
    responses: each names a partition and position the next call may ask again, and would
    answer it with the high watermark from before that fetch was sent (records produced
    since then would wait a trigger more). kafka-python's IO thread completes them in the
    background within the fetch's max wait, so the wait is bounded by a few of those (an
    older kafka-python completes them only inside ``poll``); nothing happens if its
    internals differ."""
    fetcher = getattr(consumer, "_fetcher", None)
    in_flight = getattr(fetcher, "in_flight_fetches", None)
    completed = getattr(fetcher, "_completed_fetches", None)
    if not callable(in_flight) or not isinstance(completed, collections.deque):
        logger.debug("kafka-python's fetcher has no in_flight_fetches/_completed_fetches: left as it is")
        return
    until = min(until, time.monotonic() + _IN_FLIGHT_WAIT_S)
    while in_flight() and time.monotonic() < until:
        time.sleep(0.001)
    completed.clear()


class _ProbeStalled(Exception):
    """A high-watermark probe got no answer in time (internal)."""


class OffsetClient:
    """Driver-side metadata and offset lookups.

    Holds two kafka-python consumers for the life of the stream reader: one for
    metadata and ListOffsets(earliest), one for high-watermark probes (see
    :meth:`high_watermarks`), so an idle query does not open a connection (and
    a TLS/SASL handshake) per trigger.
    """

    def __init__(self, config: Mapping[str, Any], timeout_ms: int) -> None:
        self._config = dict(config)
        self._timeout_ms = timeout_ms
        self._consumer = new_consumer(config, timeout_ms=timeout_ms)
        _set_metadata_backoff(self._consumer, int(config.get("retry_backoff_ms", _METADATA_BACKOFF_MS)))
        self._probe: KafkaConsumer | None = None
        self._seeker: KafkaConsumer | None = None  # reads single records (timestamp lookups)
        self._partitions: dict[str, list[int]] = {}
        self._refreshed_at = -math.inf
        self._topics: list[str] = []
        self._topics_at = -math.inf
        self._topic_ids: dict[str, Any] = {}
        #: topics named in the last call of partitions() that do not exist
        self.missing: list[str] = []
        #: topics seen with a new topic id (deleted and created again); emptied by the caller
        self.recreated: set[str] = set()
        #: log start offsets found by high-watermark probes that started below them
        self.log_starts: Offsets = {}

    def close(self) -> None:
        for consumer in (self._probe, self._seeker, self._consumer):
            if consumer is None:
                continue
            try:
                consumer.close(autocommit=False, timeout_ms=2000)
            except Exception:  # closing is best effort
                logger.debug("closing a driver consumer failed", exc_info=True)
        self._probe = self._seeker = None

    def partitions(self, topics: Sequence[str], *, force: bool = False, missing_ok: bool = False) -> list[TP]:
        """All partitions of ``topics``; metadata is refreshed at most once a second
        unless ``force``.

        With ``missing_ok``, topics that do not exist are left out (and listed in
        :attr:`missing`) instead of raising. A topic whose id changed since the last
        refresh (deleted and created again) is added to :attr:`recreated`, which the
        caller empties.

        Raises:
            KafkaTopicNotFoundError: a topic does not exist (after ~1 s of retries),
                unless ``missing_ok``.
        """
        stale = time.monotonic() - self._refreshed_at > _PARTITION_DISCOVERY_INTERVAL_S
        if force or stale or any(t not in self._partitions for t in topics):
            found = self._refresh(topics, wait_for_all=not missing_ok)
            self.missing = sorted(t for t, parts in found.items() if not parts)
            if self.missing and not missing_ok:
                raise KafkaTopicNotFoundError(
                    f"option 'subscribe': topic(s) {', '.join(map(repr, self.missing))} do not exist "
                    f"on {','.join(self._consumer.config['bootstrap_servers'])}"
                )
            for topic, parts in found.items():
                known = self._partitions.get(topic)
                if known and parts and len(parts) > len(known):
                    logger.info("topic %r grew from %d to %d partitions", topic, len(known), len(parts))
                if parts:
                    self._partitions[topic] = parts
                else:
                    self._partitions.pop(topic, None)
            self._refreshed_at = time.monotonic()
        return [(t, p) for t in topics for p in self._partitions.get(t, ())]

    def all_topics(self, *, force: bool = False) -> list[str]:
        """Every topic of the cluster (a Metadata round trip at most once a second unless ``force``)."""
        if force or time.monotonic() - self._topics_at > _PARTITION_DISCOVERY_INTERVAL_S:
            self._topics = sorted(self._consumer.topics())
            self._topics_at = time.monotonic()
        return self._topics

    def _refresh(self, topics: Sequence[str], wait_for_all: bool) -> dict[str, list[int]]:
        deadline = time.monotonic() + 1.0
        while True:
            self._consumer.topics()  # forces a Metadata round trip
            found = {t: sorted(self._consumer.partitions_for_topic(t) or ()) for t in topics}
            if not wait_for_all or all(found.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        cluster = getattr(getattr(self._consumer, "_client", None), "cluster", None)
        topic_id = getattr(cluster, "topic_id", None)  # kafka-python 3 keeps topic ids (KIP-516)
        for topic, parts in found.items():
            current = topic_id(topic) if topic_id is not None and parts else None
            if current is None:
                continue
            previous = self._topic_ids.get(topic)
            if previous is not None and previous != current:
                self.recreated.add(topic)
            self._topic_ids[topic] = current
        return found

    def earliest(self, tps: Sequence[TP]) -> Offsets:
        """Log start offsets (ListOffsets earliest)."""
        if not tps:
            return {}
        _import_kafka_python()
        from kafka import TopicPartition
        from kafka.errors import KafkaTimeoutError

        try:
            found = self._consumer.beginning_offsets(
                [TopicPartition(t, p) for t, p in tps], timeout_ms=self._timeout_ms
            )
        except KafkaTimeoutError as exc:
            raise KafkaSourceTimeoutError(
                f"no earliest offsets for {sorted(tps)} within {self._timeout_ms} ms"
            ) from exc
        return {(tp.topic, tp.partition): int(off) for tp, off in found.items()}

    def high_watermarks(self, positions: Mapping[TP, int]) -> Offsets:
        """The high watermark of each partition, read from a Fetch response.

        ``positions`` must be offsets in the log or equal to its end; the fetch
        starts there and the records it returns are decoded and dropped, so
        passing the last known end keeps a probe cheap (it then only carries
        what was appended since). ListOffsets(latest) is not used on purpose,
        see the module docstring.

        A returned value is never above the true high watermark. It is below the
        given position only when the log no longer reaches it (the topic was
        recreated, or the broker lost data). It comes from a fetch sent during
        this call: responses to the previous call's fetches are dropped (see
        ``_drop_earlier_fetches``; if kafka-python's internals differ, such a
        response can make it lag by the few milliseconds before this call).

        Raises:
            KafkaSourceTimeoutError: no answer within ``fetchOffset.timeoutMs``.
        """
        if not positions:
            return {}
        deadline = time.monotonic() + self._timeout_ms / 1000
        for attempt in (1, 2):
            if self._probe is None:
                self._probe = new_consumer(
                    self._config,
                    timeout_ms=self._timeout_ms,
                    fetch_max_wait_ms=_PROBE_FETCH_WAIT_MS,
                    max_partition_fetch_bytes=_PROBE_PARTITION_FETCH_BYTES,
                    fetch_min_bytes=1,
                    # KIP-227 incremental fetch sessions leave partitions whose state
                    # did not change out of the response: a re-probe would never see
                    # their high watermark. Full Fetch requests answer for all.
                    enable_incremental_fetch_sessions=False,
                )
                # Records are dropped: read only batch headers, so that probing is cheap and a
                # batch that cannot be decoded is reported by the task that reads it, with its offset.
                _batches.install_skipping(self._probe)
            # The first attempt gets a short leash: a healthy broker answers in
            # milliseconds, and a wedged consumer is replaced by a fresh one.
            until = min(deadline, time.monotonic() + _PROBE_STALL_S) if attempt == 1 else deadline
            try:
                return self._probe_once(self._probe, positions, until)
            except _ProbeStalled as stalled:
                probe, self._probe = self._probe, None
                try:
                    probe.close(autocommit=False, timeout_ms=1000)
                except Exception:
                    logger.debug("closing a stalled probe consumer failed", exc_info=True)
                if attempt == 2 or time.monotonic() >= deadline:
                    raise KafkaSourceTimeoutError(
                        f"no Fetch response with a high watermark for {stalled.args[0]} within "
                        f"{self._timeout_ms} ms (option fetchOffset.timeoutMs)"
                    ) from None
                logger.warning(
                    "high-watermark probe stalled on %s; retrying with a new consumer", stalled.args[0]
                )
        raise InternalError("unreachable")

    def _probe_once(self, consumer: KafkaConsumer, positions: Mapping[TP, int], until: float) -> Offsets:
        _import_kafka_python()
        from kafka import TopicPartition
        from kafka.errors import CorruptRecordError, OffsetOutOfRangeError, UnsupportedCodecError

        wanted = {TopicPartition(t, p): off for (t, p), off in positions.items()}
        result: Offsets = {}
        pending = set(wanted)
        _drop_earlier_fetches(consumer, until)
        # Never pause() partitions here: kafka-python parks the buffered data of
        # paused partitions and, after unsubscribe()/assign(), may then never
        # fetch them again.
        consumer.assign(list(wanted))  # assignment is empty: fresh state, highwater() is None
        try:
            for tp, off in wanted.items():
                consumer.seek(tp, off)
            while pending:
                try:
                    consumer.poll(timeout_ms=_PROBE_FETCH_WAIT_MS, max_records=_PROBE_MAX_RECORDS)
                except OffsetOutOfRangeError as exc:
                    self._handle_out_of_range(consumer, exc, wanted)
                except (CorruptRecordError, UnsupportedCodecError, KafkaDecodeError):
                    pass  # (without install_skipping) the response's high watermark is known all the same
                for tp in list(pending):
                    hw = consumer.highwater(tp)
                    if hw is not None:
                        result[(tp.topic, tp.partition)] = int(hw)
                        pending.discard(tp)
                if pending and time.monotonic() > until:
                    raise _ProbeStalled(sorted((tp.topic, tp.partition) for tp in pending))
        finally:
            consumer.unsubscribe()
        return result

    def _handle_out_of_range(
        self, consumer: KafkaConsumer, exc: Exception, wanted: dict[TopicPartition, int]
    ) -> None:
        bad = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
        if not bad:
            raise KafkaDataLossError(f"offset out of range while probing: {exc!r}") from exc
        earliest = self.earliest([(tp.topic, tp.partition) for tp in bad])
        for tp, off in bad.items():
            start = earliest[(tp.topic, tp.partition)]
            # Below the log start: deleted by retention, the end is still after it. Beyond
            # the end: the log was reset (topic recreated, broker lost data); its end, now
            # below the position, tells the caller (failOnDataLoss decides what then).
            consumer.seek(tp, start)
            wanted[tp] = start
            self.log_starts[(tp.topic, tp.partition)] = start


    # ------------------------------------------------------------------ timestamps

    def offset_for_timestamp(self, tp: TP, timestamp: int, log_start: int, log_end: int) -> int | None:
        """The offset of the first record of ``tp`` whose timestamp is at or after ``timestamp``
        (ms), None when there is none in ``[log_start, log_end)``.

        The broker's answer (ListOffsets with a timestamp) is checked against the records
        themselves: it is right when the record there is at or after ``timestamp`` and the one
        before it is not. Some brokers answer every such lookup with offset 0 (tansu 0.6);
        then the offset is found by a binary search over the records' timestamps, which
        finds Kafka's answer when timestamps do not decrease along the log (log-append
        time, or one producer's create time).

        Raises:
            KafkaSourceTimeoutError: a record could not be read within ``fetchOffset.timeoutMs``.
        """
        if log_start >= log_end:
            return None
        answer = self._broker_offset_for_time(tp, timestamp)
        if answer is not None and log_start <= answer <= log_end and self._is_first_at(tp, answer, timestamp,
                                                                                         log_start, log_end):
            return None if answer >= log_end else answer
        logger.info("%s-%d: the broker's offset for timestamp %d (%s) is not right; searching the log",
                    tp[0], tp[1], timestamp, answer)
        lo, hi = log_start, log_end  # the first record at or after timestamp is in [lo, hi), or there is none
        found: int | None = None
        while lo < hi:
            mid = (lo + hi) // 2
            record = self._record_at(tp, mid, log_end)
            if record is None:  # no record from mid on (control records / gaps at the end)
                hi = mid
            elif record[1] >= timestamp:
                found, hi = record[0], mid
            else:
                lo = record[0] + 1
        return found

    def _is_first_at(self, tp: TP, offset: int, timestamp: int, log_start: int, log_end: int) -> bool:
        if offset < log_end:
            record = self._record_at(tp, offset, log_end)
            if record is None or record[0] != offset or record[1] < timestamp:
                return False
        if offset == log_start:
            return True
        before = self._last_record_before(tp, offset, log_start)
        return before is None or before[1] < timestamp

    def _last_record_before(self, tp: TP, offset: int, log_start: int) -> tuple[int, int] | None:
        """The last record below ``offset`` (offsets can have gaps: compaction, control records)."""
        step = 1
        while True:
            start = max(log_start, offset - step)
            last: tuple[int, int] | None = None
            at = start
            while at < offset:
                record = self._record_at(tp, at, offset)
                if record is None:
                    break
                last, at = record, record[0] + 1
            if last is not None or start == log_start:
                return last
            step *= 16

    def _broker_offset_for_time(self, tp: TP, timestamp: int) -> int | None:
        _import_kafka_python()
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        key = TopicPartition(*tp)
        try:
            found = self._consumer.offsets_for_times({key: timestamp}, timeout_ms=self._timeout_ms)
        except (KafkaError, ValueError) as exc:
            logger.info("no offset for timestamp %d of %s from the broker: %r", timestamp, tp, exc)
            return None
        answer = found.get(key)
        return None if answer is None else int(answer.offset)

    def _record_at(self, tp: TP, offset: int, end: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record of ``tp`` at or after ``offset`` and below
        ``end``; None when there is none."""
        _import_kafka_python()
        from kafka import TopicPartition

        if offset >= end:
            return None
        if self._seeker is None:
            self._seeker = new_consumer(
                self._config, timeout_ms=self._timeout_ms, fetch_max_wait_ms=_PROBE_FETCH_WAIT_MS,
                max_partition_fetch_bytes=_PROBE_PARTITION_FETCH_BYTES, enable_incremental_fetch_sessions=False,
            )
        consumer = self._seeker
        key = TopicPartition(*tp)
        consumer.assign([key])
        try:
            consumer.seek(key, offset)
            deadline = time.monotonic() + self._timeout_ms / 1000
            while True:
                for record in consumer.poll(timeout_ms=_PROBE_FETCH_WAIT_MS * 10, max_records=1).get(key, ()):
                    if record.offset >= end:
                        return None
                    return int(record.offset), int(record.timestamp)
                if consumer.position(key) >= end:
                    return None
                if time.monotonic() > deadline:
                    raise KafkaSourceTimeoutError(
                        f"no record of {tp[0]}-{tp[1]} at offset {offset} within {self._timeout_ms} ms "
                        "(option fetchOffset.timeoutMs)"
                    )
        finally:
            consumer.unsubscribe()
