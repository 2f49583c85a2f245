"""How a data file is written (catalog/writer.py): its statistics taken from the footer pyarrow
wrote (catalog/files.py, ``written_stats``), the count that decides its dictionary encoding,
what a FileWriter works out once per schema: nothing a file holds or records changes, only
how it is worked out.

The reference is the former code, which the catalog keeps: :func:`compute_stats` over the
rows as written (column ids on, stored names), min_max for every column; and for the
encoding, ``pc.count_distinct`` of each primitive column's first rows. The properties:

1. for rows of every type a column can have (nulls, NaN, -0.0, infinities, extremes, empty
   files, strings too long for the footer, several row groups, a stored name, a nested
   column before the others), :meth:`FileWriter.write` records the statistics JSON text
   :func:`compute_stats` gives, byte for byte (``-0.0`` is not ``0.0`` in the text);
2. the file is the one the former code wrote, byte for byte: pq.write_table with the former
   dictionary decision (booleans, which are no longer counted, included), the count made for
   every file of 2 rows or more (``DICTIONARY_ALL_ROWS`` set to 1 for the property);
3. a file of at most ``DICTIONARY_ALL_ROWS`` rows is dictionary-encoded whole (pyarrow's
   default), and one row more brings the count back.

No catalog: this is file writing alone, the same on every backend.
"""

from __future__ import annotations

import decimal
import json
import math
import struct
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lakestep.catalog import writer as writer_module
from lakestep.catalog.columns import STORED, assign, to_stored, with_ids
from lakestep.catalog.files import compute_stats
from lakestep.catalog.writer import DICTIONARY_ALL_ROWS, DICTIONARY_SAMPLE_ROWS, FileWriter

I64 = 2 ** 63
NAN2 = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]  # a NaN of another payload
FLOATS = st.one_of(st.floats(), st.sampled_from([0.0, -0.0, math.nan, NAN2, math.inf, -math.inf]))
FLOATS32 = st.one_of(st.floats(width=32), st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf]))
# past the footer's 4096 bytes pyarrow keeps no bounds: computed from the rows
TEXT = st.one_of(st.text(max_size=8), st.sampled_from(["", "a", "ä", "\U0001f600", "z" * 5000, "a" * 4097 + "b"]))
BYTES = st.one_of(st.binary(max_size=6), st.sampled_from([b"", b"\x00", b"\xff" * 5000]))
US_2000 = 946684800 * 10 ** 6


def _ints(lo: int, hi: int) -> Any:
    return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0]))


def _cast(t: pa.DataType, storage: pa.DataType) -> Callable[[list[Any]], pa.Array]:
    return lambda v: pa.array(v, storage).cast(t)


def _decimals(t: pa.DataType) -> Callable[[list[Any]], pa.Array]:
    return lambda v: pa.array([None if x is None else decimal.Decimal(x).scaleb(-t.scale) for x in v], t)


def _dictionary(v: list[Any]) -> pa.Array:
    return pa.array(v, pa.string()).dictionary_encode()


# (type, values, how to make the array: None = pa.array(values, type))
COLUMNS: list[tuple[pa.DataType, Any, Callable[[list[Any]], pa.Array] | None]] = [
    (pa.int8(), _ints(-128, 127), None), (pa.int16(), _ints(-(2 ** 15), 2 ** 15 - 1), None),
    (pa.int32(), _ints(-(2 ** 31), 2 ** 31 - 1), None), (pa.int64(), _ints(-I64, I64 - 1), None),
    (pa.uint8(), _ints(0, 255), None), (pa.uint16(), _ints(0, 2 ** 16 - 1), None),
    (pa.uint32(), _ints(0, 2 ** 32 - 1), None), (pa.uint64(), _ints(0, 2 ** 64 - 1), None),
    (pa.float32(), FLOATS32, None), (pa.float64(), FLOATS, None),
    (pa.float16(), st.sampled_from([0.0, -0.0, 1.5, -2.0, math.nan, math.inf]), None),
    (pa.bool_(), st.booleans(), None),
    (pa.string(), TEXT, None), (pa.large_string(), TEXT, None), (pa.string_view(), TEXT, None),
    (pa.binary(), BYTES, None), (pa.large_binary(), BYTES, None), (pa.binary_view(), BYTES, None),
    (pa.binary(3), st.binary(min_size=3, max_size=3), None),
    (pa.date32(), _ints(-719162, 2932896), _cast(pa.date32(), pa.int32())),
    (pa.date64(), _ints(-719162, 2932896).map(lambda d: d * 86_400_000), _cast(pa.date64(), pa.int64())),
    (pa.time32("s"), _ints(0, 86399), _cast(pa.time32("s"), pa.int32())),
    (pa.time32("ms"), _ints(0, 86_399_999), _cast(pa.time32("ms"), pa.int32())),
    (pa.time64("us"), _ints(0, 86_399_999_999), _cast(pa.time64("us"), pa.int64())),
    (pa.time64("ns"), _ints(0, 86_399_999_999_999), _cast(pa.time64("ns"), pa.int64())),
    *[(pa.timestamp(unit, tz), _ints(-(10 ** 10), 10 ** 10).map(lambda s, k=k: s * k), _cast(pa.timestamp(unit, tz), pa.int64()))
      for unit, k in (("s", 1), ("ms", 1000), ("us", 10 ** 6), ("ns", 10 ** 8))
      for tz in (None, "UTC", "Europe/Paris", "+05:30")],
    (pa.timestamp("us"), st.integers(-10 ** 9, 10 ** 9).map(lambda s: US_2000 + s), _cast(pa.timestamp("us"), pa.int64())),
    (pa.timestamp("ns"), st.integers(-I64 + 1, I64 - 1), _cast(pa.timestamp("ns"), pa.int64())),
    (pa.duration("us"), _ints(-(10 ** 12), 10 ** 12), _cast(pa.duration("us"), pa.int64())),
    *[(t, _ints(1 - 10 ** min(t.precision, 30), 10 ** min(t.precision, 30) - 1), _decimals(t))
      for t in (pa.decimal128(10, 2), pa.decimal128(38, 10), pa.decimal128(5, 0), pa.decimal256(50, 20),
                pa.decimal32(9, 3), pa.decimal64(18, 4))],
    (pa.dictionary(pa.int32(), pa.string()), st.sampled_from(["a", "b", "é"]), _dictionary),
    (pa.null(), st.none(), None),
    (pa.list_(pa.int64()), st.lists(st.one_of(st.none(), st.integers(-5, 5)), max_size=3), None),
    (pa.struct([("a", pa.int32()), ("b", pa.string())]),
     st.fixed_dictionaries({"a": st.one_of(st.none(), st.integers(-5, 5)), "b": st.one_of(st.none(), TEXT)}), None),
    (pa.map_(pa.string(), pa.int64()), st.lists(st.tuples(st.text(max_size=2), st.integers(-3, 3)), max_size=2), None),
]


def _old_dictionary(data: pa.Table, leaves: list[list[str]]) -> "list[str] | bool":
    """The former decision (writer.py before the count got cheaper): pc.count_distinct of every
    primitive column's sample; mostly distinct columns plain."""
    if data.num_rows < 2:
        return True
    sample = data.slice(0, DICTIONARY_SAMPLE_ROWS)
    plain = set()
    for i, col in enumerate(sample.columns):
        t = col.type
        if pa.types.is_nested(t) or pa.types.is_dictionary(t) or pa.types.is_null(t):
            continue
        try:
            distinct = pc.count_distinct(col, mode="all").as_py()
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            continue
        if distinct * 2 > len(col):
            plain.add(i)
    if not plain:
        return True
    return [p for i, paths in enumerate(leaves) if i not in plain for p in paths]


def _encodings(md: pq.FileMetaData) -> list[list[tuple[str, ...]]]:
    return [[tuple(sorted(md.row_group(r).column(j).encodings)) for j in range(md.num_columns)]
            for r in range(md.num_row_groups)]


@st.composite
def files(draw: Any) -> tuple[pa.Schema, pa.Table, int]:
    """A table schema (a column stored under another name), rows of it (nulls, chunks), a row group size."""
    picks = draw(st.lists(st.integers(0, len(COLUMNS) - 1), min_size=1, max_size=4))
    n = draw(st.integers(0, 12))
    fields, arrays = [], []
    for k, i in enumerate(picks):
        t, values, make = COLUMNS[i]
        nullable = draw(st.lists(st.one_of(st.none(), values) if not pa.types.is_null(t) else st.none(),
                                 min_size=n, max_size=n))
        arr = make(nullable) if make is not None else pa.array(nullable, t)
        cut = draw(st.integers(0, n))  # two chunks sometimes
        col = pa.chunked_array([arr.slice(0, cut), arr.slice(cut)], arr.type) if 0 < cut < n else pa.chunked_array([arr])
        meta = {STORED: f"was_{k}".encode()} if k == 1 else None  # renamed: stored under its former name
        fields.append(pa.field(f"c{k}", arr.type, metadata=meta))
        arrays.append(col)
    schema = pa.schema(fields)
    data = pa.Table.from_arrays(arrays, schema=pa.schema([pa.field(f.name, f.type) for f in fields]))
    return schema, data, draw(st.sampled_from([1 << 20, 1, 3]))


@pytest.fixture(scope="module")
def where(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("footer")


@settings(max_examples=600, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(files())
@example((pa.schema([("x", pa.float64())]), pa.table({"x": [-0.0, 1.0, None]}), 1 << 20))  # footer min 0.0 -> -0.0
@example((pa.schema([("x", pa.float64())]), pa.table({"x": [-1.0, -0.0]}), 1 << 20))  # footer max -0.0 -> 0.0
@example((pa.schema([("x", pa.float64())]), pa.table({"x": [math.nan, 2.0, math.nan, -3.0]}), 1))
@example((pa.schema([("x", pa.float32())]), pa.table({"x": pa.array([math.nan, None], pa.float32())}), 1 << 20))
@example((pa.schema([("s", pa.string())]), pa.table({"s": ["b" * 5000, "a"]}), 1 << 20))  # no footer bounds
@example((pa.schema([("t", pa.timestamp("us", "Europe/Paris"))]),
          pa.table({"t": pa.array([0, 10 ** 12], pa.timestamp("us", "Europe/Paris"))}), 1))
@example((pa.schema([("l", pa.list_(pa.int64())), ("i", pa.int64())]),
          pa.table({"l": [[5, 6], None], "i": [1, 2]}), 1 << 20))  # a nested column's leaves come first
@example((pa.schema([("i", pa.int64())]), pa.table({"i": pa.array([], pa.int64())}), 1 << 20))  # an empty file
def test_written_statistics_are_computed_statistics(where: Path, case: tuple[pa.Schema, pa.Table, int]) -> None:
    """Properties 1 and 2."""
    schema, data, row_group_size = case
    ids = assign(schema)
    writer = FileWriter(str(where), column_ids=ids, schema=schema, row_group_size=row_group_size)
    with pytest.MonkeyPatch.context() as mp:  # count for every file, as the former code did
        mp.setattr(writer_module, "DICTIONARY_ALL_ROWS", 1)
        f = writer.write(data)
    written = to_stored(with_ids(data, ids), schema)  # the rows as the former code wrote them
    assert f.stats_json == json.dumps(compute_stats(written), separators=(",", ":"))
    former = pa.BufferOutputStream()
    leaves = writer.layout(data.schema).paths()
    pq.write_table(written, former, compression="snappy", row_group_size=row_group_size, write_statistics=True,
                   use_dictionary=_old_dictionary(written, leaves))
    got, want = (where / f.path).read_bytes(), former.getvalue().to_pybytes()
    if got != want:  # say where
        assert _encodings(pq.ParquetFile(pa.BufferReader(got)).metadata) == \
            _encodings(pq.ParquetFile(pa.BufferReader(want)).metadata)
        assert got == want
    (where / f.path).unlink()


def test_writer_keeps_the_layout_of_one_schema(where: Path) -> None:
    """Rows of the same schema reuse what the writer worked out of it; another schema (other
    field metadata included) gets its own, and its files their own ids and statistics."""
    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])
    writer = FileWriter(str(where), column_ids=assign(schema), schema=schema)
    one = pa.table({"a": [1, 2], "b": ["x", "y"]}, schema=schema)
    writer.write(one)
    first = writer.layout(one.schema)
    writer.write(pa.table({"a": [3], "b": ["z"]}, schema=schema))
    assert writer.layout(schema) is first
    other = schema.with_metadata({b"k": b"v"})
    f = writer.write(pa.table({"a": [7], "b": [None]}, schema=other))
    assert writer.layout(other) is not first
    assert json.loads(f.stats_json) == {"a": [7, 7, 0], "b": [None, None, 1]}
    back = pq.read_schema(where / f.path)
    assert back.metadata[b"k"] == b"v" and back.field("a").metadata[b"PARQUET:field_id"] == b"1"


def test_small_files_are_dictionary_encoded_whole(where: Path) -> None:
    """Property 3: up to DICTIONARY_ALL_ROWS rows no column is counted (a unique column is
    dictionary-encoded, as pyarrow does by default); one row more, the unique columns are
    plain and the repetitive one keeps its dictionary. The rows read back unchanged."""
    def dictionary_encoded(n: int) -> dict[str, bool]:
        data = pa.table({"id": pa.array(range(n), pa.int64()), "x": [i * 0.5 for i in range(n)],
                         "kind": [f"k{i % 3}" for i in range(n)]})
        f = FileWriter(str(where)).write(data)
        md = pq.ParquetFile(where / f.path).metadata
        assert pq.read_table(where / f.path).equals(data)
        return {md.schema.column(j).path: "RLE_DICTIONARY" in md.row_group(0).column(j).encodings
                for j in range(md.num_columns)}

    assert dictionary_encoded(DICTIONARY_ALL_ROWS) == {"id": True, "x": True, "kind": True}
    assert dictionary_encoded(DICTIONARY_ALL_ROWS + 1) == {"id": False, "x": False, "kind": True}


def test_boolean_columns_are_never_dictionary_encoded() -> None:
    """Why a boolean column needs no count: pyarrow's Parquet writer has no dictionary for them."""
    out = pa.BufferOutputStream()
    pq.write_table(pa.table({"b": [True, False] * 50, "c": [True] * 100}), out, use_dictionary=True)
    md = pq.ParquetFile(pa.BufferReader(out.getvalue())).metadata
    assert not any("DICTIONARY" in e for j in range(2) for e in md.row_group(0).column(j).encodings)
