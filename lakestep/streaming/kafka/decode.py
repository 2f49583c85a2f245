"""Column-wise decoding of Kafka record batches into Arrow (executor side).

kafka-python turns every record into a ``ConsumerRecord`` namedtuple through
pure-Python varint decoding (about 8 µs per small record), which is most of
the cost of a Kafka read. This module decodes the raw record batches of a
Fetch response instead:

* the bytes of every v2 (magic 2) record batch are walked once to find where
  each record starts (one short Python loop step per record);
* every field (offset and timestamp deltas, key and value lengths) is then
  decoded for all records at once with numpy, and keys and values are gathered
  into the data buffers of Arrow binary arrays, without creating Python
  objects per record.

It plugs into kafka-python's consumer rather than replacing it: connections,
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

Semantics kept from kafka-python's decoder: CRC-32C check of every batch when
``check_crcs`` (the default), compressed batches (gzip, snappy, lz4, zstd:
kafka-python's codecs), control batches skipped, records before the fetch
offset dropped, log-append-time batches, the record-size consistency check,
legacy (magic 0/1) message sets (decoded by kafka-python, record by record).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import InternalError, InvalidArgumentError
from .errors import KafkaDecodeError, describe
from .kafka_python import import_kafka_python
from .schema import HEADERS_ARROW_TYPE, TIMESTAMP_ARROW_TYPE, arrow_schema

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


def _corrupt(message: str) -> Exception:
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
        raise _corrupt(f"the {name}-compressed records do not decompress ({describe(exc)})") from exc


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
            raise _corrupt(f"Record size is less than the minimum record overhead ({length})")
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
            raise _corrupt(f"Record batch of {len(view)} bytes is shorter than its header")
        (base_offset, _length, leader_epoch, _magic, crc, attributes, last_offset_delta, first_ts, max_ts,
         _pid, _epoch, _seq, count) = _V2_HEADER.unpack_from(view)
        if self.check_crcs and calc_crc32c(view[_CRC_COVERED_FROM:]) != crc:
            raise _corrupt(f"Record batch at offset {base_offset} failed crc check")
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
            raise _corrupt(f"Record batch at offset {batch.base_offset} failed crc check")
        out = DecodedBatch()
        for record in batch:
            if self.check_crcs and not record.validate_crc():
                raise _corrupt(f"Record at offset {record.offset} failed crc check")
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


# ============================================================================ decoding


def _zigzag(raw: int) -> int:
    return (raw >> 1) ^ -(raw & 1)


def _step_table() -> list[int]:
    """For the two bytes at a record's start (little-endian), the record's size
    including its length varint, when that varint is 1 or 2 bytes long (records
    under 8 KiB); 0 otherwise."""
    table = [0] * 65536
    for pair in range(65536):
        b0, b1 = pair & 0xFF, pair >> 8
        if b0 < 0x80:
            length, width = _zigzag(b0), 1
        elif b1 < 0x80:
            length, width = _zigzag((b0 & 0x7F) | (b1 << 7)), 2
        else:
            continue
        if length > 0:
            table[pair] = length + width
    return table


_STEP = _step_table()


def _record_starts(body: bytes, count: int, base: int, starts: list[int]) -> None:
    """Append where each record (its length varint) starts, as positions in
    ``body`` + ``base``. The one per-record Python loop of the decoder; records
    are contiguous, so each one ends where the next starts."""
    pos = 0
    step_table = _STEP
    try:
        for _ in range(count):
            step = step_table[body[pos] | (body[pos + 1] << 8)]
            if not step:  # a record of 8 KiB or more (or a corrupt length)
                raw, shift, at = 0, 0, pos
                while True:
                    b = body[at]
                    raw |= (b & 0x7F) << shift
                    at += 1
                    if b < 0x80:
                        break
                    shift += 7
                    if shift > 28:
                        raise _corrupt("record length varint is too long")
                length = _zigzag(raw)
                if length <= 0:
                    raise _corrupt(f"invalid record length {length}")
                step = at - pos + length
            starts.append(base + pos)
            pos += step
    except IndexError:
        raise _corrupt("record batch ends inside a record") from None
    if pos != len(body):
        raise _corrupt(f"{len(body) - pos} unconsumed bytes after all records")


def _varints(data: np.ndarray, pos: np.ndarray, limit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag varints starting at every ``pos`` (each must end before its ``limit``):
    (values, widths)."""
    if len(pos) and (pos >= limit).any():
        raise _corrupt("record field beyond the end of its record")
    first = data[pos]
    raw = (first & 0x7F).astype(np.uint64)
    width = np.ones(len(pos), dtype=np.int64)
    more = np.flatnonzero(first & 0x80)
    shift = 7
    while len(more):
        if shift > 63:
            raise _corrupt("varint is too long")
        at = pos[more] + width[more]
        if (at >= limit[more]).any():
            raise _corrupt("varint runs past the end of its record")
        byte = data[at]
        raw[more] |= (byte & 0x7F).astype(np.uint64) << np.uint64(shift)
        width[more] += 1
        more = more[(byte & 0x80) != 0]
        shift += 7
    values = (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)
    return values, width


def _binary_column(data: pa.Buffer, start: np.ndarray, length: np.ndarray) -> pa.Array:
    """A binary array of ``data[start:start+length]`` per row, null where ``length < 0``.

    The rows' byte ranges are disjoint and ascending, so ``data`` cut at every
    range's start and end is a valid binary array whose even elements are the
    rows: Arrow's ``take`` copies them out in C++."""
    n = len(start)
    if n == 0:
        return pa.array([], pa.binary())
    valid = length >= 0
    size = np.where(valid, length, 0)
    cuts = np.empty(2 * n, dtype=np.int64)
    cuts[0::2] = start
    cuts[1::2] = start + size
    if cuts[-1] > np.iinfo(np.int32).max:
        raise InvalidArgumentError("more than 2 GiB of records in one Arrow batch",
                                   argument="length", value=int(cuts[-1]))
    pieces = pa.Array.from_buffers(pa.binary(), 2 * n - 1, [None, pa.py_buffer(cuts.astype(np.int32)), data])
    rows = pieces.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int32)))
    null_count = int(n - np.count_nonzero(valid))
    if not null_count:
        return rows
    validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    _, offsets, payload = rows.buffers()
    return pa.Array.from_buffers(pa.binary(), n, [validity, offsets, payload], null_count, rows.offset)


def _decode_raw(batches: Sequence[RawBatch]) -> tuple[dict[str, Any], np.ndarray]:
    """Decode v2 batches column-wise: (columns, row mask of the records to keep)."""
    starts: list[int] = []
    bodies: list[bytes] = []
    base = 0
    for b in batches:
        _record_starts(b.body, b.count, base, starts)
        bodies.append(b.body)
        base += len(b.body)
    data = np.frombuffer(b"".join(bodies), dtype=np.uint8)
    counts = [b.count for b in batches]
    begin = np.asarray(starts, dtype=np.int64)  # of each record's length varint
    end = np.empty_like(begin)  # records are contiguous within a batch...
    end[:-1] = begin[1:]
    last = np.cumsum(counts) - 1  # ...and the last record of a batch ends with it
    end[last] = np.cumsum([len(body) for body in bodies])
    _, width = _varints(data, begin, end)
    start = begin + width  # of each record's fields

    def per_record(values: list[int], dtype: Any = np.int64) -> np.ndarray:
        return np.repeat(np.asarray(values, dtype=dtype), counts)

    # Record => Length, Attributes int8, TimestampDelta, OffsetDelta, Key, Value, Headers
    ts_delta, w = _varints(data, start + 1, end)
    pos = start + 1 + w
    offset_delta, w = _varints(data, pos, end)
    pos += w
    key_len, w = _varints(data, pos, end)
    key_start = pos + w
    pos = key_start + np.maximum(key_len, 0)
    value_len, w = _varints(data, pos, end)
    value_start = pos + w
    pos = value_start + np.maximum(value_len, 0)
    if (key_len < -1).any() or (value_len < -1).any() or (pos >= end).any():
        raise _corrupt("invalid key or value length")
    header_count = data[pos]
    plain = (header_count == 0) & (pos + 1 == end)  # no headers, and the record ends right here

    log_append = per_record([b.timestamp_type for b in batches], np.int32)
    timestamp = np.where(log_append == 1, per_record([b.max_timestamp for b in batches]),
                         per_record([b.first_timestamp for b in batches]) + ts_delta)
    offset = per_record([b.base_offset for b in batches]) + offset_delta
    keep = offset >= per_record([b.min_offset for b in batches])
    columns = {
        "key": (key_start, key_len),
        "value": (value_start, value_len),
        "offset": offset,
        "timestamp": timestamp,
        "timestampType": log_append,
        "data": data,
        "headers_at": (pos, end, plain),
    }
    return columns, keep


def _headers(data: np.ndarray, pos: np.ndarray, end: np.ndarray, plain: np.ndarray
             ) -> list[list[tuple[str, bytes | None]]]:
    """Parse the headers of the records that have some (checking each record's size)."""
    import_kafka_python()
    from kafka.record.util import decode_varint

    result: list[list[tuple[str, bytes | None]]] = [[] for _ in range(len(pos))]
    raw = data.tobytes() if not plain.all() else b""
    for i in np.flatnonzero(~plain).tolist():
        p, stop = int(pos[i]), int(end[i])
        try:
            count, p = decode_varint(raw, p)
            if count < 0:
                raise _corrupt(f"Found invalid number of record headers {count}")
            items = []
            for _ in range(count):
                key_len, p = decode_varint(raw, p)
                if key_len < 0:
                    raise _corrupt(f"Invalid negative header key size {key_len}")
                key = raw[p:p + key_len].decode("utf-8")
                p += key_len
                value_len, p = decode_varint(raw, p)
                value = None
                if value_len >= 0:
                    value = raw[p:p + value_len]
                    p += value_len
                items.append((key, value))
        except (IndexError, ValueError) as exc:  # ValueError: also UnicodeDecodeError, as kafka-python
            if isinstance(exc, UnicodeDecodeError):
                raise
            raise _corrupt(f"Found invalid record structure: {exc!r}") from None
        if p != stop:
            raise _corrupt(f"Invalid record size: the record ends at {stop}, its fields at {p}")
        result[i] = items
    return result


def _constant_string(value: str, n: int) -> pa.Array:
    encoded = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(encoded))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(encoded * n)])


def to_record_batch(segments: Sequence[Segment], topic: str, partition: int, start: int, end: int,
                    include_headers: bool) -> pa.RecordBatch | None:
    """One Arrow batch of :func:`~.schema.arrow_schema` with the records of
    ``segments`` whose offsets are in ``[start, end)`` (None if there are none).

    Raises:
        KafkaDecodeError: naming the base offset of the first batch whose records
            cannot be decoded.
    """
    try:
        return _to_record_batch(segments, topic, partition, start, end, include_headers)
    except KafkaDecodeError:
        raise
    except Exception as exc:
        # The batches were decoded together; find the first one that fails alone.
        offset = next((s.base_offset for s in segments if isinstance(s, RawBatch) and _fails(s, include_headers)),
                      segments[0].base_offset if segments and isinstance(segments[0], RawBatch) else start)
        raise KafkaDecodeError(topic, partition, offset, describe(exc)) from exc


def _fails(batch: RawBatch, include_headers: bool) -> bool:
    try:
        _raw_to_batch([batch], "", 0, -1, 2**63 - 1, include_headers)
    except Exception:
        return True
    return False


def _to_record_batch(segments: Sequence[Segment], topic: str, partition: int, start: int, end: int,
                     include_headers: bool) -> pa.RecordBatch | None:
    parts: list[pa.RecordBatch] = []
    run: list[RawBatch] = []

    def flush_raw() -> None:
        if run:
            parts.append(_raw_to_batch(run, topic, partition, start, end, include_headers))
            run.clear()

    for segment in segments:
        if isinstance(segment, RawBatch):
            run.append(segment)
        else:
            flush_raw()
            parts.append(_decoded_to_batch(segment, topic, partition, start, end, include_headers))
    flush_raw()
    parts = [p for p in parts if p.num_rows]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    table = pa.Table.from_batches(parts).combine_chunks()
    return table.to_batches()[0]


def _raw_to_batch(batches: Sequence[RawBatch], topic: str, partition: int, start: int, end: int,
                  include_headers: bool) -> pa.RecordBatch:
    columns, keep = _decode_raw(batches)
    offset = columns["offset"]
    keep &= (offset >= start) & (offset < end)
    data = columns["data"]
    buffer = pa.py_buffer(data)
    header_pos, record_end, plain = columns["headers_at"]
    headers = None
    if include_headers or not plain.all():
        headers = _headers(data, header_pos, record_end, plain)  # also checks those records' sizes
    rows = np.flatnonzero(keep) if not keep.all() else None

    def pick(a: np.ndarray) -> np.ndarray:
        return a if rows is None else a[rows]

    key_start, key_len = columns["key"]
    value_start, value_len = columns["value"]
    n = len(offset) if rows is None else len(rows)
    arrays = [
        _binary_column(buffer, pick(key_start), pick(key_len)),
        _binary_column(buffer, pick(value_start), pick(value_len)),
        _constant_string(topic, n),
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(pick(offset)),
        pa.array(pick(columns["timestamp"]) * 1000).view(TIMESTAMP_ARROW_TYPE),
        pa.array(pick(columns["timestampType"])),
    ]
    if include_headers:
        assert headers is not None
        chosen = headers if rows is None else [headers[i] for i in rows.tolist()]
        arrays.append(pa.array([[{"key": k, "value": v} for k, v in h] for h in chosen], HEADERS_ARROW_TYPE))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers))


def _decoded_to_batch(batch: DecodedBatch, topic: str, partition: int, start: int, end: int,
                      include_headers: bool) -> pa.RecordBatch:
    rows = [i for i, o in enumerate(batch.offsets) if start <= o < end]
    n = len(rows)
    arrays = [
        pa.array([batch.keys[i] for i in rows], pa.binary()),
        pa.array([batch.values[i] for i in rows], pa.binary()),
        _constant_string(topic, n),
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array([batch.offsets[i] for i in rows], pa.int64()),
        pc.multiply(pa.array([batch.timestamps[i] for i in rows], pa.int64()), 1000).cast(TIMESTAMP_ARROW_TYPE),
        pa.array([batch.timestamp_types[i] for i in rows], pa.int32()),
    ]
    if include_headers:
        arrays.append(pa.array([[] for _ in rows], HEADERS_ARROW_TYPE))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers))


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
