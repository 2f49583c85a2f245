"""Widening a column's type and making a column optional (issue 35), on both backends.

Each change is one commit (``ALTER``, in ``history()`` with what changed), metadata
only: the files written before stay as they are and read as the new type, through
every reader (Arrow, filters that prune by the old files' statistics, primary-key
merges of files of both types, DuckDB, time travel), and through Iceberg. Writers
holding the old schema: their appends land and read right, their rewrites are
refused. Every refused change is a :class:`SchemaChangeError` and changes nothing.
"""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest

from lakestep import Catalog
from lakestep.errors import InvalidArgumentError, SchemaChangedConflict, SchemaChangeError

D = decimal.Decimal
OLD = pa.schema([pa.field("id", pa.int32(), nullable=False), ("small", pa.int8()), ("x", pa.float32()),
                 ("price", pa.decimal128(5, 2)), pa.field("note", pa.string(), nullable=False)])
WIDE = {"id": pa.int64(), "small": pa.int32(), "x": pa.float64(), "price": pa.decimal128(12, 2)}


def old_rows(first: int, n: int = 3) -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table({"id": ids, "small": [i % 100 for i in ids], "x": [i + 0.5 for i in ids],
                     "price": [D(i) / 4 for i in ids], "note": [f"n{i}" for i in ids]}, schema=OLD)


def widen_all(t) -> None:  # type: ignore[no-untyped-def]
    for i, (name, typ) in enumerate(WIDE.items()):  # the type positionally, as a user writes it first, or by name
        if i % 2:
            t.update_column(name, typ)
        else:
            t.update_column(name, type=typ)
    t.update_column("note", nullable=True)


@pytest.mark.parametrize("primary_key", [[], ["id"]], ids=["plain", "keyed"])
def test_widen_then_read_old_and_new_files_everywhere(catalog: Catalog, primary_key: list[str]) -> None:
    catalog.create_namespace("w", exist_ok=True)
    t = catalog.create_table("w.t" + "".join(primary_key), OLD, primary_key=primary_key,
                             partition_by=[] if primary_key else ["small"])
    t.append(old_rows(0))
    t.append(old_rows(3))
    before = t.version
    widen_all(t)
    assert t.version == before + 5  # one commit per change
    assert t.schema == pa.schema([pa.field("id", pa.int64(), nullable=False), ("small", pa.int32()),
                                  ("x", pa.float64()), ("price", pa.decimal128(12, 2)), ("note", pa.string())])
    big = 2 ** 40
    t.append(pa.table({"id": [big], "small": [1000], "x": [1e300], "price": [D("1234567890.12")], "note": [None]},
                      schema=t.schema))
    if primary_key:  # a newer row of key 1, written wide, wins over the narrow one
        t.upsert(pa.table({"id": [1], "small": [7], "x": [0.25], "price": [D("9.99")], "note": ["wide"]},
                          schema=t.schema))
    got = t.to_arrow().sort_by("id")
    assert got.schema == t.schema
    want = [{"id": i, "small": i % 100, "x": i + 0.5, "price": D(i) / 4, "note": f"n{i}"} for i in range(6)]
    if primary_key:
        want[1] = {"id": 1, "small": 7, "x": 0.25, "price": D("9.99"), "note": "wide"}
    want.append({"id": big, "small": 1000, "x": 1e300, "price": D("1234567890.12"), "note": None})
    assert got.to_pylist() == want
    # filters over the old files' statistics and the new ones'
    assert t.to_arrow(where=[("id", ">", 2 ** 31)]).column("id").to_pylist() == [big]
    cheap = sorted(t.to_arrow(where=[("price", "<", D("0.6"))]).column("id").to_pylist())
    assert cheap == ([0, 2] if primary_key else [0, 1, 2])  # (key 1's newer row costs 9.99)
    # time travel to before the change reads the old rows with that version's schema
    old = t.to_arrow(version=before).sort_by("id")
    assert old.schema == OLD and old.column("id").to_pylist() == list(range(6))
    assert t.to_arrow(version=before + 5).schema == t.schema  # (the last change: the schema of today)
    # the history says what changed
    alters = [h for h in t.history() if h.operation == "ALTER"]
    assert [(h.summary["column"], h.summary.get("to_type"), h.summary.get("nullable")) for h in reversed(alters)] == [
        ("id", "int64", None), ("small", "int32", None), ("x", "double", None),
        ("price", "decimal128(12, 2)", None), ("note", None, True)]
    assert all(h.added_files == 0 and h.removed_files == 0 and h.data_version == alters[-1].data_version
               for h in alters)


def test_duckdb_reads_widened_tables(catalog: Catalog) -> None:
    from lakestep.query.duck import duckdb_query

    catalog.create_namespace("d", exist_ok=True)
    t = catalog.create_table("d.t", OLD)
    t.append(old_rows(0))
    widen_all(t)
    t.append(pa.table({"id": [2 ** 40], "price": [D("1234567890.12")], "note": [None]},
                      schema=pa.schema([t.schema.field("id"), t.schema.field("price"), t.schema.field("note")])))
    r = duckdb_query(catalog, "SELECT sum(id) AS s, max(price) AS p, count(note) AS n FROM d.t",
                     level="read_uncommitted").table
    assert r.to_pylist() == [{"s": 2 ** 40 + 3, "p": D("1234567890.12"), "n": 3}]


def test_writers_holding_the_old_schema(catalog: Catalog, catalog_spec) -> None:  # type: ignore[no-untyped-def]
    catalog.create_namespace("o", exist_ok=True)
    t = catalog.create_table("o.t", OLD)
    t.append(old_rows(0))
    other = catalog_spec.open()
    try:
        stale = other.load_table("o.t")  # read the old schema
        widen_all(t)
        stale.append(old_rows(10, 2))  # a blind append under the old schema lands, written narrow
        with pytest.raises(SchemaChangedConflict):
            stale.delete([("id", "=", 0)])  # a rewrite under the old schema is refused
        assert sorted(t.to_arrow().column("id").to_pylist()) == [0, 1, 2, 10, 11]
        assert t.to_arrow().schema == t.schema
    finally:
        other.close()


REFUSED = [
    ("id", {"type": pa.int16()}, "not a safe widening"),
    ("x", {"type": pa.float16()}, "not a safe widening"),
    ("x", {"type": pa.int64()}, "not a safe widening"),
    ("note", {"type": pa.int64()}, "not a safe widening"),
    ("price", {"type": pa.decimal128(12, 3)}, "scale"),
    ("price", {"type": pa.decimal128(4, 2)}, "gain digits"),
    ("x", {"nullable": False}, "cannot be made required"),
    ("nope", {"type": pa.int64()}, "no such column"),
]


@pytest.mark.parametrize("i", range(len(REFUSED)), ids=[f"{c}-{r[:12]}" for c, _, r in REFUSED])
def test_refused_changes_change_nothing(catalog: Catalog, i: int) -> None:
    column, change, reason = REFUSED[i]
    catalog.create_namespace("r", exist_ok=True)
    name = f"r.t{i}"
    t = catalog.create_table(name, OLD)
    t.append(old_rows(0))
    v, schema = t.version, t.schema
    with pytest.raises(SchemaChangeError, match=reason) as e:
        t.update_column(column, **change)
    assert e.value.column == column and e.value.table == name
    t.refresh()
    assert (t.version, t.schema) == (v, schema)


def test_keys_and_calls_without_a_change(catalog: Catalog) -> None:
    catalog.create_namespace("k", exist_ok=True)
    t = catalog.create_table("k.t", OLD, primary_key=["id"])
    with pytest.raises(SchemaChangeError, match="primary-key column cannot take nulls"):
        t.update_column("id", nullable=True)
    t.update_column("id", type=pa.int64())  # a key may widen; rows of both widths merge (tested above)
    with pytest.raises(InvalidArgumentError):
        t.update_column("x")
    v = t.version
    t.update_column("small", nullable=True)  # optional already: nothing to commit
    t.update_column("id", type=pa.int64())  # that type already: the same (the call is idempotent)
    assert t.version == v


def test_iceberg_publishes_the_widened_schema(catalog: Catalog) -> None:
    """The change is published as the matching Iceberg schema update (same field ids, the
    promoted types), and PyIceberg reads the old narrow files and the new wide ones."""
    from lakestep.barrier import OPEN_EPOCH, Pipeline, sealing
    from lakestep.iceberg import Publisher, sql_catalog
    from lakestep.iceberg.mapping import ids_of

    catalog.create_namespace("i", exist_ok=True)
    t = catalog.create_table("i.t", OLD)
    Pipeline(catalog).register_job("feed", sinks=["i.t"], external_input=True)
    lease = sealing.acquire(catalog, "test", 1e9)
    pub = Publisher(catalog)
    try:
        t.append(old_rows(0), barrier=OPEN_EPOCH)
        sealing.seal(catalog, lease, 1e9)
        assert not pub.publish_once().errors
        first = sql_catalog(catalog).load_table("i.t").schema()
        widen_all(t)
        t.reorder_columns(["note", "id", "small", "x", "price"])
        t.append(pa.table({"id": [2 ** 40], "small": [1000], "x": [1e300], "price": [D("1234567890.12")],
                           "note": [None]}, schema=pa.schema([t.schema.field(n) for n in OLD.names])),
                 barrier=OPEN_EPOCH)
        sealing.seal(catalog, lease, 1e9)
        assert not pub.publish_once().errors
        ice = sql_catalog(catalog).load_table("i.t")
        now = ice.schema()
        assert ids_of(now) == ids_of(first) == dict(t.meta.column_ids.ids)
        assert [(f.name, str(f.field_type)) for f in now.fields] == [
            ("note", "string"), ("id", "long"), ("small", "int"), ("x", "double"), ("price", "decimal(12, 2)")]
        assert not now.find_field("note").required
        got = ice.scan().to_arrow().sort_by("id")
        assert got.column("id").to_pylist() == [0, 1, 2, 2 ** 40]
        assert got.column("price").to_pylist() == [D(0), D("0.25"), D("0.5"), D("1234567890.12")]
        assert got.column("x").to_pylist()[-1] == 1e300
    finally:
        pub.close()


@pytest.mark.parametrize("primary_key", [[], ["id"]], ids=["plain", "keyed"])
def test_reorder_columns(catalog: Catalog, primary_key: list[str]) -> None:
    """A new column order is one commit; every reader returns it over files of both orders,
    ids stay with their columns, and writers may give columns in any order."""
    from lakestep.query.duck import duckdb_query

    catalog.create_namespace("o", exist_ok=True)
    name = "o.t" + "".join(primary_key)
    t = catalog.create_table(name, OLD, primary_key=primary_key)
    t.append(old_rows(0))
    ids = dict(t.meta.column_ids.ids)
    v = t.version
    order = ["note", "price", "id", "x", "small"]
    t.reorder_columns(order)
    assert t.schema.names == order and t.version == v + 1 and dict(t.meta.column_ids.ids) == ids
    t.append(old_rows(3).select(["id", "small", "x", "price", "note"]))  # the old order: matched by name
    t.reorder_columns(order)  # that order already: nothing committed
    assert t.version == v + 2
    got = t.to_arrow().sort_by("id")
    assert got.column_names == order
    assert got.column("note").to_pylist() == [f"n{i}" for i in range(6)]
    assert t.to_arrow(version=v).column_names == OLD.names  # time travel: that version's order
    assert duckdb_query(catalog, f"SELECT * FROM {name} ORDER BY id", level="read_uncommitted").table.column_names \
        == order
    assert [h.summary for h in t.history() if h.operation == "ALTER"] == [
        {"change": "reorder_columns", "from": OLD.names, "to": order}]
    for bad, why in ((["note", "price", "id", "x"], "left out"), (order + ["id"], "more than once"),
                     (order + ["nope"], "no such column")):
        with pytest.raises(SchemaChangeError, match=why):
            t.reorder_columns(bad)
    assert t.version == v + 2
