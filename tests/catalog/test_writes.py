"""Writes (append, overwrite, delete, update, compact), schema checks and time travel."""

from __future__ import annotations

import datetime as dt
import os

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from lakestep import Catalog, errors
from lakestep.clock import ManualClock

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.string()), ("amount", pa.float64())])


def rows(t: pa.Table) -> list[tuple]:
    return sorted(tuple(r.values()) for r in t.to_pylist())


@pytest.fixture
def table(catalog: Catalog):  # type: ignore[no-untyped-def]
    catalog.create_namespace("s")
    return catalog.create_table("s.t", SCHEMA, partition_by=["day"])


def data(*rs: tuple) -> pa.Table:
    return pa.table({"id": [r[0] for r in rs], "day": [r[1] for r in rs], "amount": [r[2] for r in rs]},
                    schema=SCHEMA)


def test_append_records_files_with_stats(table) -> None:  # type: ignore[no-untyped-def]
    res = table.append(data((1, "d1", 1.0), (2, "d1", None), (3, "d2", 3.5)))
    assert (res.version, res.data_version, res.added_files, res.added_rows) == (1, 1, 2, 3)
    files = sorted(table.files(), key=lambda f: f.partition["day"])
    assert [f.partition for f in files] == [{"day": "d1"}, {"day": "d2"}]
    d1 = files[0]
    assert d1.record_count == 2
    assert d1.stats["id"].min == 1 and d1.stats["id"].max == 2
    assert d1.stats["amount"].null_count == 1
    full = os.path.join(table.location, d1.path)
    assert os.path.getsize(full) == d1.file_size
    assert pq.read_metadata(full).num_rows == 2
    assert table.count() == 3


def test_overwrite_variants(table) -> None:  # type: ignore[no-untyped-def]
    table.append(data((1, "d1", 1.0), (2, "d2", 2.0), (3, "d3", 3.0)))
    table.overwrite(data((10, "d1", 10.0)), partitions=[{"day": "d1"}])
    assert rows(table.to_arrow()) == [(2, "d2", 2.0), (3, "d3", 3.0), (10, "d1", 10.0)]
    table.overwrite(data((20, "d2", 20.0), (30, "d3", 30.0)), partitions="dynamic")
    assert rows(table.to_arrow()) == [(10, "d1", 10.0), (20, "d2", 20.0), (30, "d3", 30.0)]
    # an empty overwrite leaves its range empty: nothing "shows through"
    table.overwrite(data(), partitions=[{"day": "d2"}])
    assert rows(table.to_arrow()) == [(10, "d1", 10.0), (30, "d3", 30.0)]
    # predicate overwrite: rewrites straddling files, keeps rows outside the range
    table.append(data((40, "d3", 40.0), (41, "d3", 41.0)))
    table.overwrite(data((35, "d3", 35.0)), where=[("id", ">=", 30), ("id", "<", 41)])
    assert rows(table.to_arrow()) == [(10, "d1", 10.0), (35, "d3", 35.0), (41, "d3", 41.0)]
    with pytest.raises(errors.DataOutOfRangeError):
        table.overwrite(data((99, "d1", 1.0)), where=[("id", "<", 50)])
    with pytest.raises(errors.InvalidArgumentError):
        table.overwrite(data((1, "d1", 1.0)), partitions=[{"amount": 1.0}])
    # the whole table
    table.overwrite(data((7, "d7", 7.0)))
    assert rows(table.to_arrow()) == [(7, "d7", 7.0)]
    assert [h.operation for h in table.history()][:3] == ["OVERWRITE", "OVERWRITE", "APPEND"]


def test_delete_and_update(table) -> None:  # type: ignore[no-untyped-def]
    table.append(data((1, "d1", 1.0), (2, "d1", 2.0), (3, "d2", 3.0), (4, "d2", None)))
    r = table.delete([("id", "in", [2, 3])])
    assert r.operation == "DELETE" and r.summary["deleted_rows"] == 2
    assert rows(table.to_arrow()) == [(1, "d1", 1.0), (4, "d2", None)]
    table.update({"amount": 5.0}, [("amount", "is_null", None)])
    table.update({"amount": ds.field("amount") * 10}, [("id", "=", 1)])
    assert rows(table.to_arrow()) == [(1, "d1", 10.0), (4, "d2", 5.0)]
    # a delete whose predicate matches nothing changes no file and no data version
    dv = table.data_version
    r = table.delete([("id", "=", 999)])
    assert (r.removed_files, r.added_files, r.data_version) == (0, 0, dv)
    # OR of ANDs
    table.delete([[("id", "=", 1)], [("day", "=", "d2"), ("amount", ">", 1.0)]])
    assert table.to_arrow().num_rows == 0
    with pytest.raises(errors.InvalidPredicateError):
        table.delete([("nope", "=", 1)])
    with pytest.raises(errors.InvalidPredicateError):
        table.delete([("id", "~", 1)])
    with pytest.raises(errors.SchemaMismatchError):
        table.update({"nope": 1}, [("id", "=", 1)])


def test_compaction_changes_no_data_version(table) -> None:  # type: ignore[no-untyped-def]
    for i in range(5):
        table.append(data((i, "d1", float(i))))
    before = rows(table.to_arrow())
    dv = table.data_version
    r = table.compact()
    assert r.operation == "COMPACT" and (r.removed_files, r.added_files) == (5, 1)
    assert r.data_version == dv and r.version == table.version
    assert rows(table.to_arrow()) == before
    assert len(table.files()) == 1
    assert table.to_arrow(data_version=dv).num_rows == 5
    assert table.compact().removed_files == 0  # nothing left to merge


def test_schema_mismatch_is_refused_and_nothing_written(table) -> None:  # type: ignore[no-untyped-def]
    table.append(data((1, "d1", 1.0)))
    n_files = sum(len(fs) for _, _, fs in os.walk(table.location))
    bad = [
        pa.table({"id": ["x"], "day": ["d1"], "amount": [1.0]}),  # wrong type
        pa.table({"id": [1], "day": ["d1"], "amount": [1.0], "extra": [1]}),  # extra column
        pa.table({"id": [1.5], "day": ["d1"], "amount": [1.0]}),  # lossy cast
    ]
    for b in bad:
        with pytest.raises(errors.SchemaMismatchError) as ei:
            table.append(b)
        assert ei.value.table == "s.t" and ei.value.problems
    with pytest.raises(errors.ArgumentTypeError):
        table.append("not data")
    assert table.version == 1
    assert sum(len(fs) for _, _, fs in os.walk(table.location)) == n_files
    # accepted: column order, lossless widening, a missing nullable column
    table.append(pa.table({"day": ["d2"], "id": pa.array([2], pa.int32())}))
    assert rows(table.to_arrow()) == [(1, "d1", 1.0), (2, "d2", None)]


def test_not_null_primary_key(catalog: Catalog) -> None:
    catalog.create_namespace("s")
    t = catalog.create_table("s.pk", SCHEMA, primary_key=["id"])
    with pytest.raises(errors.SchemaMismatchError):
        t.append(pa.table({"id": [None], "day": ["x"], "amount": [1.0]}, schema=SCHEMA))


def test_time_travel(clocked: Catalog, clock: ManualClock) -> None:
    clocked.create_namespace("s")
    table = clocked.create_table("s.t", SCHEMA, partition_by=["day"])
    created = clock.now()
    clock.advance(10)
    t0 = clock.now()
    table.append(data((1, "d1", 1.0)))
    clock.advance(10)
    t1 = clock.now()
    clock.advance(10)
    table.append(data((2, "d1", 2.0)))
    table.compact()
    table.delete([("id", "=", 1)])
    assert [h.version for h in table.history()] == [4, 3, 2, 1, 0]
    assert [h.data_version for h in table.history()] == [3, 2, 2, 1, 0]
    assert rows(table.to_arrow(version=0)) == []
    assert rows(table.to_arrow(version=1)) == [(1, "d1", 1.0)]
    assert rows(table.to_arrow(version=3)) == [(1, "d1", 1.0), (2, "d1", 2.0)]
    assert rows(table.to_arrow(data_version=2)) == [(1, "d1", 1.0), (2, "d1", 2.0)]
    assert rows(table.to_arrow()) == [(2, "d1", 2.0)]
    assert rows(table.to_arrow(as_of=t1)) == [(1, "d1", 1.0)]
    assert rows(table.to_arrow(as_of=dt.datetime.fromtimestamp(t1, dt.timezone.utc))) == [(1, "d1", 1.0)]
    assert rows(table.to_arrow(as_of=t0)) == [(1, "d1", 1.0)]  # the last commit at or before it
    assert rows(table.to_arrow(as_of=t0 - 1)) == []  # before the first commit: the empty table
    assert table.meta.created_at == created
    assert rows(table.to_arrow(as_of=created)) == []
    with pytest.raises(errors.VersionNotFoundError):
        table.to_arrow(as_of=created - 1e-3)  # before the table existed
    with pytest.raises(errors.VersionNotFoundError):
        table.to_arrow(version=99)
    with pytest.raises(errors.VersionNotFoundError):
        table.to_arrow(data_version=99)
    with pytest.raises(errors.InvalidArgumentError):
        table.to_arrow(version=1, data_version=1)
    times = [h.committed_at for h in reversed(table.history())]
    # commits in the same instant still get increasing times (1 us apart)
    assert times == [created, t0, t1 + 10, t1 + 10 + 1e-6, t1 + 10 + 2e-6]


def test_reads_prune_by_stats(table) -> None:  # type: ignore[no-untyped-def]
    table.append(data((1, "d1", 1.0), (2, "d1", 2.0)))
    table.append(data((100, "d1", 1.0)))
    out = table.to_arrow(where=[("id", ">", 50)], columns=["id"])
    assert out.to_pylist() == [{"id": 100}]


def test_data_files_dictionary_encode_only_repetitive_columns(catalog: Catalog) -> None:
    """Mostly-distinct primitive columns are written plain (as parquet-mr does), the others, and every
    nested leaf, with a dictionary; the rows read back unchanged."""
    n = 20_000
    schema = pa.schema([("id_x", pa.int64()), ("kind", pa.string()), ("v", pa.float64()),
                        ("tags", pa.list_(pa.int64())), ("s", pa.struct([("a", pa.int64()), ("b", pa.string())])),
                        ("m", pa.map_(pa.string(), pa.int64()))])
    catalog.create_namespace("enc")
    t = catalog.create_table("enc.t", schema)
    rows_in = pa.table({"id_x": list(range(n)), "kind": [f"k{i % 7}" for i in range(n)],
                        "v": [i * 0.5 for i in range(n)], "tags": [[i, i % 3] for i in range(n)],
                        "s": [{"a": i, "b": "q"} for i in range(n)], "m": [[("k", i % 5)] for i in range(n)]},
                       schema=schema)
    t.append(rows_in)
    (f,) = t.files()
    md = pq.ParquetFile(os.path.join(t.location, f.path)).metadata
    dictionary = {md.schema.column(i).path: "RLE_DICTIONARY" in md.row_group(0).column(i).encodings
                  for i in range(md.num_columns)}
    assert dictionary == {"id_x": False, "kind": True, "v": False, "tags.list.element": True, "s.a": True,
                          "s.b": True, "m.key_value.key": True, "m.key_value.value": True}
    assert t.to_arrow().sort_by("id_x").equals(rows_in)
