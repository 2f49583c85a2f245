"""Renaming and dropping columns, and adding fields to struct columns (issue 35), on both
backends.

Each change is one ``ALTER`` commit, metadata only: a renamed column keeps its id and the
name its values are stored under (catalog/columns.py rule 6), so files written before read
under the new name through every reader (Arrow, filters that prune by statistics and by
partition, primary-key merges, DuckDB), and time travel to a version before the change
shows that version's schema. A dropped column's values stay in the files and are never
read again, not even by a new column of the same name. Writers holding the schema from
before: appends land (matched by id; a dropped column's values discarded, with a warning),
rewrites are refused.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest

from lakestep import Catalog
from lakestep.catalog.columns import STORED, renamed
from lakestep.errors import SchemaChangedConflict
from lakestep.query import duckdb_query

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("amout", pa.int64()), ("day", pa.string()),
                    ("addr", pa.struct([("city", pa.string()), ("zip", pa.int32())]))])


def rows(ids: list[int], schema: pa.Schema, **cols: list) -> pa.Table:  # type: ignore[type-arg]
    data = {"id": ids, **cols}
    return pa.table({n: data[n] for n in schema.names if n in data},
                    schema=pa.schema([schema.field(n) for n in schema.names if n in data]))


def first(ids: list[int]) -> pa.Table:
    return rows(ids, SCHEMA, amout=[i * 10 for i in ids], day=["d1" if i % 2 else "d2" for i in ids],
                addr=[{"city": f"c{i}", "zip": i} for i in ids])


def by_id(t, **at) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    return sorted(t.to_arrow(**at).to_pylist(), key=lambda r: r["id"])


@pytest.mark.parametrize("primary_key", [[], ["id"]], ids=["plain", "keyed"])
def test_rename_reads_old_files_under_the_new_name_everywhere(catalog: Catalog, primary_key: list[str]) -> None:
    catalog.create_namespace("r", exist_ok=True)
    name = "r.t" + "".join(primary_key)
    t = catalog.create_table(name, SCHEMA, primary_key=primary_key, partition_by=[] if primary_key else ["day"])
    t.append(first([1, 2]))
    t.append(first([3, 4]))
    before = t.version
    stale = catalog.load_table(name)  # a writer holding the schema from before
    ids = dict(t.meta.column_ids.ids)
    t.rename_column("amout", "amount")
    t.rename_column("addr.zip", "postcode")
    assert t.version == before + 2
    assert t.schema.names == ["id", "amount", "day", "addr"]
    assert t.schema.field("addr").type == pa.struct([("city", pa.string()), ("postcode", pa.int32())])
    assert t.meta.column_ids.ids[("amount",)] == ids[("amout",)]  # the ids stay with the columns
    assert t.meta.column_ids.ids[("addr", "postcode")] == ids[("addr", "zip")]
    assert catalog.load_table(name).schema.equals(t.schema)
    # a new file under the new names, and one from the writer holding the old schema (matched by id)
    t.append(rows([5], t.schema, amount=[50], day=["d1"], addr=[{"city": "c5", "postcode": 5}]))
    stale.append(first([6]))
    want = [{"id": i, "amount": i * 10, "day": "d1" if i % 2 else "d2", "addr": {"city": f"c{i}", "postcode": i}}
            for i in range(1, 7)]
    assert by_id(t) == want
    assert t.to_arrow().schema.names == ["id", "amount", "day", "addr"]
    assert STORED not in (t.to_arrow().schema.field("amount").metadata or {})  # readers return plain names
    # filters by the new name judge the files by the statistics they were written with
    assert sorted(t.to_arrow(where=[("amount", ">=", 40)]).column("id").to_pylist()) == [4, 5, 6]
    assert t.to_arrow(where=[("amount", "=", 20)], columns=["id", "amount"]).to_pylist() == [{"id": 2, "amount": 20}]
    plan = t.read_plan(where=[("amount", "=", 20)])
    assert plan.to_arrow(where=[("amount", "=", 20)]).column("id").to_pylist() == [2]
    if not primary_key:  # the statistics still prune: one file holds amount 20
        assert len(plan.files) == 1
    # DuckDB (its Arrow path) and the read plan
    got = duckdb_query(catalog, f"SELECT id, amount, addr.postcode AS pc FROM {name} ORDER BY id",
                       level="read_uncommitted").table.to_pylist()
    assert got == [{"id": i, "amount": i * 10, "pc": i} for i in range(1, 7)]
    assert sorted(t.read_plan().to_arrow().to_pylist(), key=lambda r: r["id"]) == want
    # time travel to before the renames shows that version's names
    assert by_id(t, version=before) == [{"id": i, "amout": i * 10, "day": "d1" if i % 2 else "d2",
                                         "addr": {"city": f"c{i}", "zip": i}} for i in range(1, 5)]
    assert t.to_arrow(version=before, where=[("amout", "=", 30)]).column("id").to_pylist() == [3]
    # rewrites work on the new names; the stale writer's are refused until it reloads
    t.update({"amount": 99}, [("id", "=", 1)])
    t.delete([("amount", "=", 40)])
    if primary_key:  # a keyed delete writes tombstones by key: it lands, matched by the old name
        stale.delete([("amout", "=", 20)])
    else:
        with pytest.raises(SchemaChangedConflict):
            stale.delete([("amout", "=", 20)])
    t.compact(major=True) if primary_key else t.compact(min_files=1)
    want[0]["amount"] = 99
    assert by_id(t) == [r for r in want if r["id"] != 4 and (r["id"] != 2 or not primary_key)]
    hist = [h.summary for h in t.history() if h.operation == "ALTER"]
    assert hist == [{"change": "rename_column", "from": "addr.zip", "to": "addr.postcode", "id": ids[("addr", "zip")]},
                    {"change": "rename_column", "from": "amout", "to": "amount", "id": ids[("amout",)]}]


def test_renamed_partition_and_key_columns_keep_working(catalog: Catalog) -> None:
    catalog.create_namespace("r")
    part = catalog.create_table("r.part", SCHEMA, partition_by=["day"])
    part.append(first([1, 2, 3, 4]))
    part.rename_column("day", "dt")
    assert part.partition_by == ["dt"] and catalog.load_table("r.part").partition_by == ["dt"]
    part.append(rows([5], part.schema, amout=[50], dt=["d1"], addr=[None]))
    assert len(part.read_plan(where=[("dt", "=", "d1")]).files) == 2  # the partition listing by the new name
    assert sorted(part.to_arrow(where=[("dt", "=", "d1")]).column("id").to_pylist()) == [1, 3, 5]
    part.overwrite(rows([7], part.schema, amout=[70], dt=["d2"], addr=[None]), partitions=[{"dt": "d2"}])
    assert sorted(part.to_arrow().column("id").to_pylist()) == [1, 3, 5, 7]
    keyed = catalog.create_table("r.keyed", SCHEMA, primary_key=["id"])
    keyed.upsert(first([1, 2]))
    keyed.rename_column("id", "key")
    assert keyed.primary_key == ["key"]
    keyed.upsert(pa.table({"key": [2], "amout": [222]}))
    keyed.delete([("key", "=", 1)])
    assert keyed.to_arrow().to_pylist() == [{"key": 2, "amout": 222, "day": None, "addr": None}]


def test_drop_hides_the_column_and_a_new_one_of_that_name_starts_empty(catalog: Catalog,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    catalog.create_namespace("r")
    t = catalog.create_table("r.t", SCHEMA)
    t.append(first([1, 2]))
    stale = catalog.load_table("r.t")
    dropped_id = t.meta.column_ids.ids[("amout",)]
    v = t.version
    t.drop_column("amout")
    t.drop_column("addr.zip")
    assert t.schema.names == ["id", "day", "addr"] and ("amout",) not in t.meta.column_ids.ids
    assert by_id(t) == [{"id": 1, "day": "d1", "addr": {"city": "c1"}}, {"id": 2, "day": "d2", "addr": {"city": "c2"}}]
    assert by_id(t, version=v)[0] == {"id": 1, "amout": 10, "day": "d1", "addr": {"city": "c1", "zip": 1}}
    # a writer holding the old schema: its rows land, its dropped column's values are discarded, said once
    with caplog.at_level(logging.WARNING, logger="lakestep.catalog.commit"):
        stale.append(first([3]))
    assert [r for r in caplog.records if "written under schema 0, the table is at schema 2" in r.getMessage()]
    # a new column of the dropped name (and a new struct field) never reads the old values
    t.add_columns(("amout", pa.int64()), ("addr.zip", pa.string()))
    assert t.meta.column_ids.ids[("amout",)] > dropped_id
    assert t.schema.field("amout").metadata[STORED] != b"amout"  # stored under a name no column had
    t.append(rows([4], t.schema, day=["d2"], addr=[{"city": "c4", "zip": "Z4"}], amout=[44]))
    assert by_id(t) == [{"id": i, "day": "d1" if i % 2 else "d2",
                         "addr": {"city": f"c{i}", "zip": "Z4" if i == 4 else None}, "amout": 44 if i == 4 else None}
                        for i in range(1, 5)]
    # filters on the new column are not fooled by the old one's statistics (old files: all null)
    assert t.to_arrow(where=[("amout", "=", 10)]).num_rows == 0
    assert t.to_arrow(where=[("amout", "is_null", None)]).num_rows == 3
    t.delete([("amout", "<=", 100)])  # would remove old files whole if judged by the dropped column's bounds
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2, 3]
    assert [h.summary["change"] for h in t.history() if h.operation == "ALTER"] == [
        "add_columns", "drop_column", "drop_column"]


def test_a_name_moved_between_columns_reads_each_columns_own_values(catalog: Catalog) -> None:
    """a -> c, then b -> a: the files' names a and b now mean columns c and a."""
    catalog.create_namespace("r")
    t = catalog.create_table("r.t", pa.schema([("a", pa.int64()), ("b", pa.int64())]))
    t.append(pa.table({"a": [1, 2], "b": [100, 200]}))
    t.rename_column("a", "c")
    t.rename_column("b", "a")
    t.append(pa.table({"c": [3], "a": [300]}))
    assert sorted(t.to_arrow().to_pylist(), key=lambda r: r["c"]) == [
        {"c": 1, "a": 100}, {"c": 2, "a": 200}, {"c": 3, "a": 300}]
    assert sorted(t.to_arrow(where=[("a", "=", 200)]).column("c").to_pylist()) == [2]
    assert sorted(t.to_arrow(where=[("c", "=", 1)]).column("a").to_pylist()) == [100]
    t.rename_column("c", "b")  # and back towards the names of the files
    assert sorted(t.to_arrow().to_pylist(), key=lambda r: r["b"]) == [
        {"b": 1, "a": 100}, {"b": 2, "a": 200}, {"b": 3, "a": 300}]
    # a table made from this schema stores its columns under their own names
    copy = catalog.create_table("r.copy", t.schema)
    assert not renamed(copy.schema) and copy.schema.names == ["b", "a"]
    copy.append(t.to_arrow())
    assert sorted(copy.to_arrow().to_pylist(), key=lambda r: r["b"]) == sorted(
        t.to_arrow().to_pylist(), key=lambda r: r["b"])


def test_iceberg_engines_read_renamed_dropped_and_readded_columns(catalog: Catalog) -> None:
    """Each change is published as an Iceberg schema update with the same field ids; PyIceberg,
    DuckDB and Polars read files of every schema under the names of today: a renamed column's
    old values, a dropped column gone, a column re-added under a dropped name empty in old rows."""
    from lakestep.barrier import OPEN_EPOCH, Pipeline, sealing
    from lakestep.iceberg import Publisher
    from lakestep.iceberg.mapping import ids_of
    from tests.iceberg.readers import Engines, assert_same

    catalog.create_namespace("i")
    t = catalog.create_table("i.t", SCHEMA, partition_by=["day"])
    Pipeline(catalog).register_job("feed", sinks=["i.t"], external_input=True)
    lease = sealing.acquire(catalog, "test", 1e9)
    pub = Publisher(catalog)
    try:
        t.append(first([1, 2, 3]), barrier=OPEN_EPOCH)
        sealing.seal(catalog, lease, 1e9)
        assert not pub.publish_once().errors
        t.rename_column("amout", "amount")
        t.rename_column("day", "dt")  # the partition column too
        t.drop_column("addr.zip")
        t.add_columns(("addr.zip", pa.int64()), ("note", pa.string()))
        t.drop_column("note")
        t.add_columns(("note", pa.string()))
        t.append(rows([4], t.schema, amount=[40], dt=["d2"], addr=[{"city": "c4", "zip": 44}], note=["n4"]),
                 barrier=OPEN_EPOCH)
        sealing.seal(catalog, lease, 1e9)
        report = pub.publish_once()
        assert not report.errors, report.errors
        engines = Engines(catalog)
        ice = engines.table("i.t")
        assert ids_of(ice.schema()) == dict(t.meta.column_ids.ids)
        assert [f.name for f in ice.schema().fields] == ["id", "amount", "dt", "addr", "note"]
        want = t.to_arrow()
        assert sorted(want.column("amount").to_pylist()) == [10, 20, 30, 40]
        assert_same(engines, "i.t", "main", want)
        got = ice.scan(row_filter="amount >= 20").to_arrow()  # filters by the new name, pruned by id
        assert sorted(got.column("id").to_pylist()) == [2, 3, 4]
        # files without field ids (written before ids) are found by the name mapping: stored names
        import json

        mapping = {m["field-id"]: m["names"] for m in json.loads(ice.properties["schema.name-mapping.default"])}
        ids = t.meta.column_ids.ids
        assert mapping[ids[("amount",)]] == ["amout"] and mapping[ids[("dt",)]] == ["day"]
        assert mapping[ids[("note",)]] == [f"_ls_c{ids[('note',)]}"]  # re-added: a name no column had
    finally:
        pub.close()
