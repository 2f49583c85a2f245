"""Executor side: read one partition's offset range into Arrow record batches."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from . import batches as _batches
from . import decode as _decode
from .errors import KafkaDataLossError, KafkaDecodeError, KafkaSourceError, KafkaSourceTimeoutError, describe
from .kafka_python import import_kafka_python as _import_kafka_python
from .offsets import new_consumer
from .options import KafkaSourceOptions
from .schema import HEADERS_ARROW_TYPE, TIMESTAMP_ARROW_TYPE, arrow_schema

logger = logging.getLogger(__name__)

_ARROW_BATCH_ROWS = 10_000
#: Decode record batches column-wise when kafka-python allows it (tests switch it off).
_SEGMENTED_READS = True
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _records_to_batch(
    records: Sequence[Any], topic: str, partition: int, include_headers: bool
) -> pa.RecordBatch:
    """Kafka-python ``ConsumerRecord`` namedtuples to one Arrow batch of :func:`arrow_schema`."""
    n = len(records)
    # ConsumerRecord is a namedtuple: transpose once (in C), then pick columns by name.
    index = {name: i for i, name in enumerate(records[0]._fields)}
    columns = list(zip(*records))

    def column(name: str) -> tuple[Any, ...]:
        return columns[index[name]]

    arrays: list[pa.Array] = [
        pa.array(column("key"), pa.binary()),
        pa.array(column("value"), pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array(column("offset"), pa.int64()),
        pc.multiply(pa.array(column("timestamp"), pa.int64()), 1000).cast(TIMESTAMP_ARROW_TYPE),
        pa.array(column("timestamp_type"), pa.int32()),
    ]
    if include_headers:
        arrays.append(
            pa.array(
                [[{"key": k, "value": v} for k, v in (h or ())] for h in column("headers")],
                HEADERS_ARROW_TYPE,
            )
        )
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers))


def _record_to_tuple(r: Any, include_headers: bool) -> tuple[Any, ...]:
    row = (
        r.key,
        r.value,
        r.topic,
        r.partition,
        r.offset,
        _EPOCH + timedelta(milliseconds=r.timestamp),
        r.timestamp_type,
    )
    if include_headers:
        return (*row, [(k, v) for k, v in (r.headers or ())])
    return row


def _log_start(consumer: Any, tp: Any) -> int | None:
    try:
        return int(consumer.beginning_offsets([tp])[tp])
    except Exception:  # the data loss is reported as such
        logger.debug("no log start offset for %s", tp, exc_info=True)
        return None


def read_partition_range(
    options: KafkaSourceOptions, topic: str, partition: int, start: int, end: int
) -> Iterator[pa.RecordBatch] | Iterator[tuple[Any, ...]]:
    """Read exactly the offsets ``[start, end)`` of one partition, then stop.

    Yields Arrow record batches (``rowFormat=arrow``) or tuples. Offsets missing
    inside the range (compaction, transaction markers) are skipped; records
    outside it are dropped.

    Raises:
        KafkaSourceTimeoutError: no progress for ``kafkaConsumer.pollTimeoutMs``.
        KafkaDataLossError: ``start`` is no longer (or ``end`` not yet) in the log.
        KafkaDecodeError: a record batch cannot be decoded (names topic, partition, offset).
    """
    _import_kafka_python()
    from kafka import TopicPartition
    from kafka.errors import CorruptRecordError, KafkaError, OffsetOutOfRangeError, UnsupportedCodecError

    if end <= start:
        return
    tp = TopicPartition(topic, partition)
    consumer = new_consumer(options.consumer_config, timeout_ms=options.poll_timeout_ms)
    arrow = options.row_format == "arrow"
    # Arrow: poll() yields undecoded record batches (batches.py), decoded column-wise (decode.py),
    # unless kafka-python's internals are not the expected ones.
    segmented = arrow and _SEGMENTED_READS and _batches.install(consumer)
    headers = options.include_headers
    timeout_s = options.poll_timeout_ms / 1000
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        position = start
        pending: list[Any] = []
        pending_rows = 0
        last_progress = time.monotonic()
        while position < end:
            try:
                polled = consumer.poll(timeout_ms=200, max_records=_ARROW_BATCH_ROWS)
            except OffsetOutOfRangeError as exc:
                log_start = _log_start(consumer, tp) if not options.fail_on_data_loss else None
                if log_start is None or log_start <= position:
                    raise KafkaDataLossError(
                        f"{topic}-{partition}: offsets [{position}, {end}) are not in the log any "
                        "more (retention, topic recreated, or broker data loss)"
                    ) from exc
                # failOnDataLoss=false: retention deleted them since the batch was planned
                logger.warning(
                    "%s-%d: offsets [%d, %d) were deleted from the log (retention) before they were read; "
                    "continuing (failOnDataLoss=false): %d offset(s) skipped",
                    topic, partition, position, min(log_start, end), min(log_start, end) - position,
                )
                if log_start >= end:
                    break
                consumer.seek(tp, log_start)
                position = log_start
                last_progress = time.monotonic()
                continue
            except KafkaSourceError:
                raise
            except (CorruptRecordError, UnsupportedCodecError) as exc:  # kafka-python decoded
                raise KafkaDecodeError(topic, partition, position, describe(exc)) from exc
            except KafkaError:
                raise
            except Exception as exc:  # a codec library's own error, while kafka-python decoded
                raise KafkaDecodeError(topic, partition, position, describe(exc)) from exc
            records = polled.get(tp, ())
            new_position = max(position, consumer.position(tp))
            if not segmented:  # (segments may reach past `end`: they are trimmed when decoded)
                if records and (records[0].offset < position or records[-1].offset >= end):
                    records = [r for r in records if position <= r.offset < end]
                if records:
                    new_position = max(new_position, records[-1].offset + 1)
            if new_position > position:
                position = new_position
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > timeout_s:
                raise KafkaSourceTimeoutError(
                    f"{topic}-{partition}: stuck at offset {position} of [{start}, {end}) for "
                    f"{options.poll_timeout_ms} ms (high watermark {consumer.highwater(tp)}; "
                    "option kafkaConsumer.pollTimeoutMs)"
                )
            if not records:
                continue
            if segmented:
                for segment in records:
                    if isinstance(segment, _batches.RawBatch) and segment.base_offset >= end:
                        continue  # fetched past the range: not decoded at all
                    pending.append(segment)
                    pending_rows += segment.count
                    if pending_rows >= _ARROW_BATCH_ROWS:
                        batch = _decode.to_record_batch(pending, topic, partition, start, end, headers)
                        if batch is not None:
                            yield batch
                        pending, pending_rows = [], 0
            elif arrow:
                pending.extend(records)
                pending_rows += len(records)
                if pending_rows >= _ARROW_BATCH_ROWS:
                    yield _records_to_batch(pending, topic, partition, headers)
                    pending, pending_rows = [], 0
            else:
                for record in records:
                    yield _record_to_tuple(record, headers)
        if pending and segmented:
            batch = _decode.to_record_batch(pending, topic, partition, start, end, headers)
            if batch is not None:
                yield batch
        elif pending:
            yield _records_to_batch(pending, topic, partition, headers)
    finally:
        consumer.close(autocommit=False, timeout_ms=2000)
