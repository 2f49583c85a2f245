"""Column-wise decoding of Kafka record batches into Arrow (executor side).

kafka-python turns every record into a ``ConsumerRecord`` namedtuple through
pure-Python varint decoding (about 8 µs per small record), which is most of
the cost of a Kafka read. This module decodes the raw record batches of a
Fetch response instead (framed, checked and decompressed by batches.py, whose
hook has kafka-python's consumer hand them over undecoded):

* the bytes of every v2 (magic 2) record batch are walked once to find where
  each record starts (one short Python loop step per record);
* every field (offset and timestamp deltas, key and value lengths) is then
  decoded for all records at once with numpy, and keys and values are gathered
  into the data buffers of Arrow binary arrays, without creating Python
  objects per record.

Semantics kept from kafka-python's decoder (batches.py and this module): CRC-32C check of
every batch when ``check_crcs`` (the default), compressed batches (gzip, snappy, lz4, zstd:
kafka-python's codecs), control batches skipped, records before the fetch
offset dropped, log-append-time batches, the record-size consistency check,
legacy (magic 0/1) message sets (decoded by kafka-python, record by record).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import InvalidArgumentError
from .batches import DecodedBatch, RawBatch, Segment, corrupt
from .errors import KafkaDecodeError, describe
from .kafka_python import import_kafka_python
from .schema import HEADERS_ARROW_TYPE, TIMESTAMP_ARROW_TYPE, arrow_schema

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
                        raise corrupt("record length varint is too long")
                length = _zigzag(raw)
                if length <= 0:
                    raise corrupt(f"invalid record length {length}")
                step = at - pos + length
            starts.append(base + pos)
            pos += step
    except IndexError:
        raise corrupt("record batch ends inside a record") from None
    if pos != len(body):
        raise corrupt(f"{len(body) - pos} unconsumed bytes after all records")


def _varints(data: np.ndarray, pos: np.ndarray, limit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag varints starting at every ``pos`` (each must end before its ``limit``):
    (values, widths)."""
    if len(pos) and (pos >= limit).any():
        raise corrupt("record field beyond the end of its record")
    first = data[pos]
    raw = (first & 0x7F).astype(np.uint64)
    width = np.ones(len(pos), dtype=np.int64)
    more = np.flatnonzero(first & 0x80)
    shift = 7
    while len(more):
        if shift > 63:
            raise corrupt("varint is too long")
        at = pos[more] + width[more]
        if (at >= limit[more]).any():
            raise corrupt("varint runs past the end of its record")
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
        raise corrupt("invalid key or value length")
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
                raise corrupt(f"Found invalid number of record headers {count}")
            items = []
            for _ in range(count):
                key_len, p = decode_varint(raw, p)
                if key_len < 0:
                    raise corrupt(f"Invalid negative header key size {key_len}")
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
            raise corrupt(f"Found invalid record structure: {exc!r}") from None
        if p != stop:
            raise corrupt(f"Invalid record size: the record ends at {stop}, its fields at {p}")
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
