"""The column-wise decoder of the ``lakestep-kafka`` source (lakestep/streaming/kafka/batches.py
frames record batches, decode.py decodes them) against kafka-python's own decoding, on record
batches built in memory: no broker, no Spark."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from lakestep.streaming.kafka import arrow_schema
from lakestep.streaming.kafka.kafka_python import import_kafka_python


def _record_set(
    batches: list[list[tuple[Any, ...]]], *, magic: int = 2, compression: int = 0, first_offset: int = 0
) -> bytes:
    """Record batches as a Fetch response carries them: one batch per list of
    ``(timestamp, key, value, headers)``, offsets following each other."""
    import_kafka_python()
    from kafka.record.memory_records import MemoryRecordsBuilder

    out, offset = b"", first_offset
    for records in batches:
        builder = MemoryRecordsBuilder(magic, compression, batch_size=1 << 30, offset=offset)
        for timestamp, key, value, headers in records:
            assert builder.append(timestamp, key, value, headers if magic == 2 else None) is not None
        builder.close()
        out += bytes(builder.buffer())
        offset += len(records)
    return out


def _set_batch_attributes(batch: bytes, bits: int) -> bytes:
    """Set attribute bits of a v2 batch (control / log-append time) and fix its CRC."""
    import struct

    import_kafka_python()
    from kafka.record.util import calc_crc32c

    data = bytearray(batch)
    (attributes,) = struct.unpack_from(">h", data, 21)
    struct.pack_into(">h", data, 21, attributes | bits)
    struct.pack_into(">I", data, 17, calc_crc32c(memoryview(data)[21:]))
    return bytes(data)


def _kafka_python_rows(buffer: bytes, start: int, end: int) -> list[dict[str, Any]]:
    """What kafka-python's own decoder makes of ``buffer``, as rows of arrow_schema(True)."""
    import_kafka_python()
    from kafka.record.memory_records import MemoryRecords

    rows = []
    records = MemoryRecords(buffer)
    while (batch := records.next_batch()) is not None:
        if getattr(batch, "is_control_batch", False):
            continue
        for r in batch:
            if start <= r.offset < end:
                ts = None if r.timestamp is None else datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(
                    milliseconds=r.timestamp
                )
                rows.append(
                    {
                        "key": r.key,
                        "value": r.value,
                        "topic": "tp",
                        "partition": 3,
                        "offset": r.offset,
                        "timestamp": ts,
                        "timestampType": r.timestamp_type,
                        "headers": [{"key": k, "value": v} for k, v in (r.headers or [])],
                    }
                )
    return rows


def _decoded_rows(buffer: bytes, start: int, end: int, fetch_offset: int = 0, **kw: Any) -> list[dict[str, Any]]:
    from lakestep.streaming.kafka import batches, decode

    segments = list(batches.BatchIterator(buffer, fetch_offset, check_crcs=True))
    batch = decode.to_record_batch(segments, "tp", 3, start, end, include_headers=kw.get("headers", True))
    if batch is None:
        return []
    assert batch.schema.equals(arrow_schema(kw.get("headers", True)))
    return batch.to_pylist()


def test_decoder_matches_kafka_python_on_edge_cases() -> None:
    big = bytes(range(256)) * 40  # 10 KiB: three-byte length varints
    records = [
        (1_700_000_000_000, b"k", b"v", []),
        (1_700_000_000_005, None, b"no key", []),
        (1_699_999_999_000, b"tomb", None, [("h1", b"x"), ("h2", None), ("h\u00e9", b"")]),
        (1_700_000_000_001, b"", b"", []),
        (0, big, big[:300], [("only", b"header")]),
    ]
    for compression in (0, 1):  # none, gzip
        buffer = _record_set([records, records[:2], records[2:]], compression=compression, first_offset=40)
        assert _decoded_rows(buffer, 0, 10**9) == _kafka_python_rows(buffer, 0, 10**9)
        # a range that starts and ends inside batches
        assert _decoded_rows(buffer, 43, 48) == _kafka_python_rows(buffer, 43, 48)
        # records before the fetch offset (a compressed batch is sent whole) are dropped
        assert [r["offset"] for r in _decoded_rows(buffer, 0, 10**9, fetch_offset=46)] == list(range(46, 50))
    headerless = _decoded_rows(_record_set([records[:2]]), 0, 10, headers=False)
    assert [r["value"] for r in headerless] == [b"v", b"no key"] and "headers" not in headerless[0]


def test_decoder_control_log_append_and_legacy_batches() -> None:
    first = _record_set([[(5, b"a", b"1", []), (9, b"b", b"2", [])]])
    marker = _set_batch_attributes(_record_set([[(7, b"\x00\x00\x00\x00", b"", [])]], first_offset=2), 0x20)
    appended = _set_batch_attributes(_record_set([[(1, None, b"3", []), (2, None, b"4", [])]], first_offset=3), 0x08)
    rows = _decoded_rows(first + marker + appended, 0, 100)
    assert [(r["offset"], r["value"], r["timestampType"]) for r in rows] == [
        (0, b"1", 0), (1, b"2", 0), (3, b"3", 1), (4, b"4", 1)
    ]
    max_ts = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=2)
    assert rows[2]["timestamp"] == rows[3]["timestamp"] == max_ts  # log-append time: the batch's max
    for magic in (0, 1):
        legacy = _record_set([[(None if magic == 0 else 7, b"k", b"v", None), (8, None, None, None)]], magic=magic)
        assert _decoded_rows(legacy, 0, 10) == _kafka_python_rows(legacy, 0, 10)


def test_decoder_rejects_corrupt_batches() -> None:
    import struct

    from lakestep.streaming.kafka import batches, decode
    from lakestep.streaming.kafka.errors import KafkaDecodeError

    def batch_at(base: int) -> bytearray:  # as a broker writes it: the base offset in the header
        data = bytearray(_record_set([[(1, b"k", b"value", [])] * 3]))
        struct.pack_into(">q", data, 0, base)  # (not covered by the CRC)
        return data

    good = batch_at(7)
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0xFF
    with pytest.raises(KafkaDecodeError, match="at offset 7 of topic 't' partition 4: CorruptRecordError.*crc"):
        list(batches.BatchIterator(bytes(bad_crc), 0, check_crcs=True, topic="t", partition=4))
    bad_length = bytearray(good)
    bad_length[61] = 0x7E  # the first record's length varint: 63 bytes, more than there are
    segments = list(batches.BatchIterator(bytes(bad_length + good), 0, check_crcs=False))
    with pytest.raises(KafkaDecodeError, match="at offset 7 of topic 't' partition 0") as failed:
        decode.to_record_batch(segments, "t", 0, 0, 20, include_headers=False)
    assert (failed.value.topic, failed.value.partition, failed.value.offset) == ("t", 0, 7)
    # the first batch that fails alone is named, also when batches before it are fine
    bad_second = batch_at(10)
    bad_second[61] = 0x7E
    segments = list(batches.BatchIterator(bytes(good + bad_second), 0, check_crcs=False))
    with pytest.raises(KafkaDecodeError, match="at offset 10 of topic 't' partition 0"):
        decode.to_record_batch(segments, "t", 0, 0, 20, include_headers=False)


def test_decoder_property_against_kafka_python() -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    blob = st.one_of(st.none(), st.binary(max_size=40), st.binary(min_size=100, max_size=20_000))
    record = st.tuples(
        st.integers(min_value=0, max_value=2**41),
        blob,
        blob,
        st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=8))), max_size=2),
    )

    @settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.lists(record, min_size=1, max_size=12), min_size=1, max_size=4), st.integers(0, 3))
    def check(batches: list[list[tuple[Any, ...]]], skip: int) -> None:
        buffer = _record_set(batches, first_offset=100)
        assert _decoded_rows(buffer, 100 + skip, 10**9) == _kafka_python_rows(buffer, 100 + skip, 10**9)

    check()
