"""Arrow types through Iceberg: every type lakestep publishes reads back the same in every engine,
partition values are the ones lakestep recorded, and the bounds written into manifests never
make an engine skip a file that holds a matching row."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pyarrow.compute as pc

from lakestep.iceberg import Publisher
from tests.iceberg.readers import Engines, assert_same, freeze

UTC = dt.timezone.utc
COLUMNS = {
    "i8": (pa.int8(), [1, -2, None]), "i16": (pa.int16(), [300, -3, None]), "i32": (pa.int32(), [1, 2, 3]),
    "i64": (pa.int64(), [2**62, -(2**62), None]),
    "u8": (pa.uint8(), [1, 255, None]), "u16": (pa.uint16(), [65535, 0, 1]), "u32": (pa.uint32(), [4294967295, 0, None]),
    "b": (pa.bool_(), [True, False, None]), "f": (pa.float32(), [0.5, -1.25, None]),
    "d": (pa.float64(), [0.25, 1e100, None]),
    "dec": (pa.decimal128(20, 4), [decimal.Decimal("1.2345"), None, decimal.Decimal("-99.0001")]),
    "s": (pa.string(), ["a", "é", None]), "ls": (pa.large_string(), ["x" * 100, "y", None]),
    "bin": (pa.binary(), [b"\x00\x01", b"", None]),
    "day": (pa.date32(), [dt.date(2024, 1, 1), dt.date(1969, 12, 31), None]),
    "tm": (pa.time64("us"), [dt.time(1, 2, 3, 4), None, dt.time(0)]),
    "ts": (pa.timestamp("us"), [dt.datetime(2024, 1, 1, 1, 2, 3, 4), None, dt.datetime(1960, 1, 1)]),
    "tstz": (pa.timestamp("us", "UTC"), [dt.datetime(2024, 1, 1, tzinfo=UTC), None, dt.datetime(2000, 1, 1, tzinfo=UTC)]),
    "tsms": (pa.timestamp("ms"), [dt.datetime(2024, 1, 1, 1, 2, 3), None, dt.datetime(2024, 5, 5)]),
    "st": (pa.struct([("a", pa.int64()), ("b", pa.string())]), [{"a": 1, "b": "x"}, None, {"a": None, "b": "z"}]),
    "lst": (pa.list_(pa.int64()), [[1, 2], [], None]),
    "mp": (pa.map_(pa.string(), pa.int64()), [[("k", 1)], None, []]),
}
SCHEMA = pa.schema([(k, v[0]) for k, v in COLUMNS.items()])


def test_every_type_reads_back_the_same(catalog) -> None:  # type: ignore[no-untyped-def]
    catalog.create_namespace("t")
    t = catalog.create_table("t.all", SCHEMA)
    t.append(pa.table({k: pa.array(v[1], v[0]) for k, v in COLUMNS.items()}, schema=SCHEMA))
    pub = Publisher(catalog)
    try:
        assert not pub.publish_once().errors
        engines = Engines(catalog)
        assert_same(engines, "t.all", "main", t.to_arrow())
        ice = engines.table("t.all").schema()
        assert [f.field_id for f in ice.fields][:3] == [1, 2, 3]
        assert str(ice.find_field("mp").field_type).startswith("map<string, long>")
    finally:
        pub.close()


def test_partitions_and_bounds_never_hide_rows(catalog) -> None:  # type: ignore[no-untyped-def]
    """Many small files partitioned by a date and a string (a null partition too); filters on
    every column with bounds in the manifests, through DuckDB and PyIceberg, equal lakestep's."""
    catalog.create_namespace("t")
    schema = pa.schema([("day", pa.date32()), ("region", pa.string()), ("n", pa.int64()), ("s", pa.string()),
                        ("amount", pa.decimal128(12, 2)), ("ts", pa.timestamp("us", "UTC"))])
    t = catalog.create_table("t.parts", schema, partition_by=["day", "region"])
    for i in range(8):
        t.append(pa.table({
            "day": [dt.date(2026, 1, 1 + i % 3), dt.date(2026, 1, 2), None],
            "region": [["eu", "us", None][i % 3], "eu", "apac"],
            "n": [i * 10, i * 10 + 1, -i], "s": [f"s{i}", "x" * 80, None],
            "amount": [decimal.Decimal(i) / 4, decimal.Decimal("10.50"), decimal.Decimal("-1.00")],
            "ts": [dt.datetime(2026, 1, 1, i, tzinfo=UTC), dt.datetime(2025, 1, 1, tzinfo=UTC), None]}, schema=schema))
    pub = Publisher(catalog)
    try:
        assert not pub.publish_once().errors
        engines = Engines(catalog, ("pyiceberg", "duckdb"))
        every = t.to_arrow()
        assert_same(engines, "t.parts", "main", every)
        ice = engines.table("t.parts")
        meta = ice.metadata_location
        files = [task.file for task in ice.scan().plan_files()]
        n_id, s_id = ice.schema().find_field("n").field_id, ice.schema().find_field("s").field_id
        assert len(files) >= 8 and all(n_id in f.lower_bounds for f in files)  # the bounds the filters meet
        assert any(s_id not in f.upper_bounds for f in files)  # 80 characters: no bound, never a wrong one
        con = engines.duck()
        cases = [
            ("n = 31", pc.equal(every["n"], 31)),
            ("n BETWEEN 20 AND 41", pc.and_(pc.greater_equal(every["n"], 20), pc.less_equal(every["n"], 41))),
            ("s = 's5'", pc.equal(every["s"], "s5")),
            ("s = '" + "x" * 80 + "'", pc.equal(every["s"], "x" * 80)),
            ("amount = 1.75", pc.equal(every["amount"], decimal.Decimal("1.75"))),
            ("day = DATE '2026-01-02'", pc.equal(every["day"], pa.scalar(dt.date(2026, 1, 2)))),
            ("region IS NULL", pc.is_null(every["region"])),
            ("ts >= TIMESTAMPTZ '2026-01-01 05:00:00+00'",
             pc.greater_equal(every["ts"], pa.scalar(dt.datetime(2026, 1, 1, 5, tzinfo=UTC), pa.timestamp("us", "UTC")))),
        ]
        for where, mask in cases:
            want = sorted(freeze(r["n"]) for r in every.filter(pc.fill_null(mask, False)).to_pylist())
            got = sorted(r[0] for r in con.execute(f"SELECT n FROM iceberg_scan(?) WHERE {where}", [meta]).fetchall())
            assert got == want, (where, got, want)
            assert want, where  # each filter matches something: a wrong bound would drop it
        scan = engines.table("t.parts").scan(row_filter="n >= 41").to_arrow()
        assert sorted(scan["n"].to_pylist()) == sorted(x for x in every["n"].to_pylist() if x >= 41)
    finally:
        pub.close()
