"""Kafka record batches as a Fetch response holds them (executor side): their framing,
and the hook that has kafka-python's consumer hand them over undecoded.

:class:`BatchIterator` walks the bytes of one fetched partition batch by batch: the v2
(magic 2) header is parsed (base offset, record count, timestamps, attributes), the CRC-32C
checked when ``check_crcs`` (the default), the records decompressed (gzip, snappy, lz4,
zstd: kafka-python's codecs), control batches skipped; each batch becomes a
:class:`RawBatch` whose records decode.py decodes column-wise. Legacy (magic 0/1) message
sets are decoded by kafka-python, record by record, into a :class:`DecodedBatch`.

The hook plugs into kafka-python's consumer rather than replacing it: connections,
security settings, leader discovery, fetch sessions, positions and error
handling (offset out of range, leader changes) stay kafka-python's. Only the
last step, turning a fetched partition's bytes into records, is swapped, by
giving the consumer's fetcher a ``PartitionRecords`` subclass that yields
:class:`RawBatch` / :class:`DecodedBatch` segments instead of records (see
:func:`install`). That class is internal to kafka-python, so :func:`install`
checks its shape first and leaves the consumer untouched (the caller then
reads records as usual) when it does not match, and for
``isolation.level=read_committed`` (aborted-transaction filtering stays
kafka-python's).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, Union

from ...errors import InternalError
from .errors import KafkaDecodeError, describe
from .kafka_python import import_kafka_python

# RecordBatch v2 header: BaseOffset q, Length i, PartitionLeaderEpoch i, Magic b, CRC I,
# Attributes h, LastOffsetDelta i, FirstTimestamp q, MaxTimestamp q, ProducerId q,
# ProducerEpoch h, BaseSequence i, RecordCount i.
_V2_HEADER = struct.Struct(">qiibIhiqqqhii")
_LOG_OVERHEAD = 12  # BaseOffset + Length
_MAGIC_OFFSET = 16
_CRC_COVERED_FROM = 21  # the CRC covers everything after itself
_CODEC_MASK = 0x07
_TIMESTAMP_TYPE_MASK = 0x08
_CONTROL_MASK = 0x20
_LEGACY_MIN_SIZE = 26  # LOG_OVERHEAD + the smallest v0 message


class RawBatch:
    """One v2 record batch, not decoded yet: its (decompressed) records and header."""

    __slots__ = ("body", "count", "base_offset", "first_timestamp", "max_timestamp", "timestamp_type",
                 "min_offset")

    def __init__(self, body: bytes, count: int, base_offset: int, first_timestamp: int, max_timestamp: int,
                 timestamp_type: int, min_offset: int) -> None:
        self.body = body
        self.count = count
        self.base_offset = base_offset
        self.first_timestamp = first_timestamp
        self.max_timestamp = max_timestamp
        self.timestamp_type = timestamp_type  # 0 create time, 1 log-append time
        self.min_offset = min_offset  # records before it were fetched but not asked for


class DecodedBatch:
    """Records decoded by kafka-python (legacy message format), as columns."""

    __slots__ = ("count", "offsets", "timestamps", "timestamp_types", "keys", "values", "headers")

    def __init__(self) -> None:
        self.count = 0
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.timestamp_types: list[int | None] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[list[tuple[str, bytes | None]]] = []


Segment = Union[RawBatch, DecodedBatch]


def corrupt(message: str) -> Exception:
    import_kafka_python()
    from kafka.errors import CorruptRecordError

    return CorruptRecordError(message)


# ============================================================================ framing


def _decompress(codec: int, data: memoryview) -> bytes:
    import_kafka_python()
    from kafka import codec as codecs
    from kafka.errors import UnsupportedCodecError

    decoders = {
        1: ("gzip", codecs.has_gzip, lambda d: codecs.gzip_decode(d)),
        2: ("snappy", codecs.has_snappy, lambda d: codecs.snappy_decode(d.tobytes())),
        3: ("lz4", codecs.has_lz4, lambda d: codecs.lz4_decode(d.tobytes())),
        4: ("zstd", codecs.has_zstd, lambda d: codecs.zstd_decode(d.tobytes())),
    }
    if codec not in decoders:
        raise UnsupportedCodecError(f"Unrecognized compression type: {codec}")
    name, available, decode = decoders[codec]
    if not available():
        raise UnsupportedCodecError(f"Libraries for {name} compression codec not found")
    try:
        return bytes(decode(data))
    except Exception as exc:  # each codec library has its own error types
        raise corrupt(f"the {name}-compressed records do not decompress ({describe(exc)})") from exc


def split_batches(buffer: bytes | bytearray | memoryview) -> Iterator[memoryview]:
    """The complete record batches / legacy message sets in a Fetch response's
    records bytes (a partial batch at the end, which brokers may send, is dropped)."""
    view = memoryview(buffer)
    size = len(view)
    pos = 0
    while size - pos >= _LOG_OVERHEAD:
        (length,) = struct.unpack_from(">i", view, pos + 8)
        end = pos + _LOG_OVERHEAD + length
        if end > size:
            return
        if length + _LOG_OVERHEAD < _LEGACY_MIN_SIZE:
            raise corrupt(f"Record size is less than the minimum record overhead ({length})")
        yield view[pos:end]
        pos = end


class BatchIterator:
    """Decode-free iteration over the batches of one fetched partition.

    Yields :class:`RawBatch` (v2) and :class:`DecodedBatch` (legacy) segments and
    keeps ``next_fetch_offset`` / ``leader_epoch`` / counters up to date the way
    kafka-python's ``PartitionRecords`` does.
    """

    def __init__(self, buffer: bytes | bytearray | memoryview, fetch_offset: int, check_crcs: bool,
                 topic: str = "?", partition: int = -1) -> None:
        self.buffer = buffer
        self.topic = topic
        self.partition = partition
        self.fetch_offset = fetch_offset
        self.check_crcs = check_crcs
        self.next_fetch_offset = fetch_offset
        self.leader_epoch = -1
        self.records_read = 0
        self.bytes_read = 0

    def __iter__(self) -> Iterator[Segment]:
        """The segments; a batch that cannot be decoded raises :class:`KafkaDecodeError`
        naming its base offset."""
        batches = split_batches(self.buffer)
        while True:
            try:
                view = next(batches)
            except StopIteration:
                return
            except Exception as exc:  # framing: the batch at the fetch position is unreadable
                raise KafkaDecodeError(self.topic, self.partition, self.next_fetch_offset, describe(exc)) from exc
            try:
                segment = self._segment(view)
            except KafkaDecodeError:
                raise
            except Exception as exc:  # CRC, codec, a payload that does not decompress
                (base_offset,) = struct.unpack_from(">q", view)
                raise KafkaDecodeError(self.topic, self.partition, base_offset, describe(exc)) from exc
            if segment is not None:
                yield segment

    def _segment(self, view: memoryview) -> Segment | None:
        """One batch: a segment to yield, or None (nothing to return from it)."""
        import_kafka_python()
        from kafka.record.util import calc_crc32c

        magic = view[_MAGIC_OFFSET]
        if magic < 2:
            return self._legacy(view, magic)
        if len(view) < _V2_HEADER.size:
            raise corrupt(f"Record batch of {len(view)} bytes is shorter than its header")
        (base_offset, _length, leader_epoch, _magic, crc, attributes, last_offset_delta, first_ts, max_ts,
         _pid, _epoch, _seq, count) = _V2_HEADER.unpack_from(view)
        if self.check_crcs and calc_crc32c(view[_CRC_COVERED_FROM:]) != crc:
            raise corrupt(f"Record batch at offset {base_offset} failed crc check")
        self.leader_epoch = leader_epoch
        next_offset = base_offset + last_offset_delta + 1
        if attributes & _CONTROL_MASK:  # transaction markers are not records
            self.next_fetch_offset = max(self.next_fetch_offset, next_offset)
            return None
        body: Any = view[_V2_HEADER.size:]
        codec = attributes & _CODEC_MASK
        body = _decompress(codec, body) if codec else body.tobytes()
        self.records_read += count
        self.bytes_read += len(view)
        # advanced before yielding, as kafka-python does: the fetcher takes the
        # position from here as soon as it has taken a segment
        self.next_fetch_offset = max(self.next_fetch_offset, next_offset)
        if next_offset > self.fetch_offset and count > 0:
            return RawBatch(body, count, base_offset, first_ts, max_ts,
                            1 if attributes & _TIMESTAMP_TYPE_MASK else 0, self.fetch_offset)
        return None

    def _legacy(self, view: memoryview, magic: int) -> DecodedBatch | None:
        from kafka.record.legacy_records import LegacyRecordBatch

        batch = LegacyRecordBatch(view, magic)
        if self.check_crcs and not batch.validate_crc():
            raise corrupt(f"Record batch at offset {batch.base_offset} failed crc check")
        out = DecodedBatch()
        for record in batch:
            if self.check_crcs and not record.validate_crc():
                raise corrupt(f"Record at offset {record.offset} failed crc check")
            self.records_read += 1
            self.bytes_read += record.size_in_bytes
            self.next_fetch_offset = record.offset + 1
            if record.offset < self.fetch_offset:
                continue
            out.count += 1
            out.offsets.append(record.offset)
            out.timestamps.append(record.timestamp)  # None in v0 message sets
            out.timestamp_types.append(record.timestamp_type)
            out.keys.append(record.key)
            out.values.append(record.value)
            out.headers.append([])
        return out if out.count else None


# ============================================================================ kafka-python hook

_PARTITION_RECORDS_ARGS = ("fetch_offset", "tp", "records", "key_deserializer", "value_deserializer",
                           "check_crcs", "isolation_level", "aborted_transactions", "metric_aggregator",
                           "on_drain")
_hook_class: Any = None


def _partition_records_class() -> Any:
    """kafka-python's ``Fetcher.PartitionRecords`` subclass yielding segments, or
    None when kafka-python's internals are not the ones this was written for."""
    global _hook_class
    if _hook_class is not None:
        return _hook_class or None
    import_kafka_python()
    import inspect

    try:
        from kafka.consumer.fetcher import Fetcher

        base: Any = Fetcher.PartitionRecords  # kafka-python has no types: a class mypy cannot see
        params = tuple(inspect.signature(base.__init__).parameters)[1:]
        usable = params == _PARTITION_RECORDS_ARGS and all(
            hasattr(base, name) for name in ("_unpack_records", "_maybe_skip_record", "take", "drain"))
    except (ImportError, AttributeError, TypeError, ValueError):
        usable = False
    if not usable:
        _hook_class = False
        return None

    class SegmentPartitionRecords(base):
        """Yields :class:`RawBatch` / :class:`DecodedBatch` instead of records."""

        def _maybe_skip_record(self, record: Any) -> bool:
            return False  # records before the fetch offset are dropped when decoding

        def _unpack_records(self, tp: Any, records: Any, key_deserializer: Any, value_deserializer: Any
                            ) -> Iterator[Segment]:
            buffer = getattr(records, "_buffer", None)
            if buffer is None:
                raise InternalError("kafka-python's MemoryRecords has no _buffer")
            batches = BatchIterator(buffer, self.fetch_offset, self.check_crcs, tp.topic, tp.partition)
            for segment in batches:
                self.leader_epoch = batches.leader_epoch
                self.records_read, self.bytes_read = batches.records_read, batches.bytes_read
                self.next_fetch_offset = batches.next_fetch_offset
                yield segment
            self.leader_epoch = batches.leader_epoch
            self.records_read, self.bytes_read = batches.records_read, batches.bytes_read
            self.next_fetch_offset = batches.next_fetch_offset
            self.drain()

    class SkippingPartitionRecords(base):
        """Yields nothing: reads only the batch headers to move the fetch position
        (for consumers that only want high watermarks; nothing is decompressed or decoded,
        so a batch that cannot be decoded does not stop them)."""

        next_fetch_offset: int  # the base class's, which mypy cannot see

        def _unpack_records(self, tp: Any, records: Any, key_deserializer: Any, value_deserializer: Any
                            ) -> Iterator[Segment]:
            buffer = getattr(records, "_buffer", None)
            if buffer is None:
                raise InternalError("kafka-python's MemoryRecords has no _buffer")
            for view in split_batches(buffer):
                (base_offset,) = struct.unpack_from(">q", view)
                if view[_MAGIC_OFFSET] >= 2 and len(view) >= _V2_HEADER.size:
                    (last_offset_delta,) = struct.unpack_from(">i", view, 23)
                    base_offset += last_offset_delta  # a legacy entry's offset is already its last
                self.next_fetch_offset = max(self.next_fetch_offset, base_offset + 1)
            self.drain()
            return
            yield  # a generator, like the method it replaces

    _hook_class = SegmentPartitionRecords
    _skip_class_holder.append(SkippingPartitionRecords)
    return _hook_class


_skip_class_holder: list[Any] = []


def install(consumer: Any) -> bool:
    """Make ``consumer.poll()`` return segments instead of records.

    Returns False (and leaves the consumer as it is) when kafka-python's
    internals differ from the expected ones, when the consumer reads with
    ``isolation_level=read_committed``, or has deserializers set.
    """
    config = getattr(consumer, "config", {})
    if str(config.get("isolation_level", "read_uncommitted")) != "read_uncommitted":
        return False
    if config.get("key_deserializer") is not None or config.get("value_deserializer") is not None:
        return False
    fetcher = getattr(consumer, "_fetcher", None)
    cls = _partition_records_class()
    if cls is None or fetcher is None or not hasattr(fetcher, "PartitionRecords"):
        return False
    fetcher.PartitionRecords = cls
    return True


def install_skipping(consumer: Any) -> bool:
    """Make ``consumer.poll()`` move positions without decoding any record (it returns
    nothing). Returns False (and leaves the consumer as it is) when kafka-python's
    internals differ from the expected ones."""
    fetcher = getattr(consumer, "_fetcher", None)
    if _partition_records_class() is None or fetcher is None or not hasattr(fetcher, "PartitionRecords"):
        return False
    fetcher.PartitionRecords = _skip_class_holder[0]
    return True
