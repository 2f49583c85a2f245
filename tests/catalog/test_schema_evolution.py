"""Additive schema evolution: Table.add_columns, on SQLite and PostgreSQL.

New nullable columns are metadata only: old files are not rewritten and read
null. A writer holding a handle from before the change may still append, but
its rewrites would drop the new columns' values, so they fail with
SchemaChangedConflict and leave nothing behind.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
import sqlalchemy as sa

from lakestep import Catalog, errors
from lakestep.catalog import migrations as M
from lakestep.catalog.backend import create_backend

BASE = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])


def _rows(t, **at):  # type: ignore[no-untyped-def]
    return sorted(t.to_arrow(**at).to_pylist(), key=lambda r: r["id"])


def test_added_column_reads_null_in_old_rows(catalog: Catalog) -> None:
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", BASE)
    t.append({"id": [1, 2], "v": ["a", "b"]})
    assert t.add_columns(pa.field("coupon", pa.string()), ("n", pa.int64())) is t
    assert t.schema.names == ["id", "v", "coupon", "n"]
    assert catalog.load_table("s.t").schema.equals(t.schema)
    t.append({"id": [3], "v": ["c"], "coupon": ["X"], "n": [7]})
    t.append({"id": [4], "v": ["d"]})  # the new columns may be left out: null
    assert _rows(t) == [
        {"id": 1, "v": "a", "coupon": None, "n": None},
        {"id": 2, "v": "b", "coupon": None, "n": None},
        {"id": 3, "v": "c", "coupon": "X", "n": 7},
        {"id": 4, "v": "d", "coupon": None, "n": None},
    ]
    # time travel reads an old version with that version's schema (ls_schema)
    assert _rows(t, version=1) == [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]
    assert t.read_plan(version=1).schema.names == ["id", "v"]
    assert t.to_arrow(version=1).schema.equals(BASE)
    assert t.to_arrow(where=[("coupon", "=", "X")]).column("id").to_pylist() == [3]
    t.compact()
    assert _rows(t)[2] == {"id": 3, "v": "c", "coupon": "X", "n": 7}
    t.add_columns(("coupon", pa.string()))  # exists with that type: nothing changes
    assert t.meta.schema_id == 1 and catalog.load_table("s.t").meta.schema_id == 1


def test_bad_additions_are_refused_and_change_nothing(catalog: Catalog) -> None:
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", BASE)
    with pytest.raises(errors.SchemaMismatchError, match="exists as string"):
        t.add_columns(("v", pa.int64()))
    with pytest.raises(errors.InvalidSchemaError, match="nullable"):
        t.add_columns(pa.field("w", pa.int64(), nullable=False))
    with pytest.raises(errors.InvalidIdentifierError):
        t.add_columns(("bad name", pa.int64()))
    with pytest.raises(errors.InvalidSchemaError, match="reserved"):
        t.add_columns(("_ls_deleted", pa.bool_()))
    with pytest.raises(errors.InvalidSchemaError, match="duplicate"):
        t.add_columns(("w", pa.int64()), ("w", pa.int64()))
    assert catalog.load_table("s.t").schema.equals(BASE) and catalog.load_table("s.t").meta.schema_id == 0
    with pytest.raises(errors.SchemaMismatchError):  # unknown columns are still refused
        t.append({"id": [1], "w": [1]})


def test_stale_writer_cannot_drop_new_values(catalog_spec) -> None:  # type: ignore[no-untyped-def]
    """Two catalogs (two writers): one adds a column and writes values into it; the other,
    holding a handle from before, deletes. Its copy-on-write rewrite would drop the values."""
    a, b = catalog_spec.open(), catalog_spec.open()
    a.create_namespace("s")
    ta = a.create_table("s.t", BASE)
    ta.append({"id": [1, 2, 3], "v": ["a", "b", "c"]})
    tb = b.load_table("s.t")  # the stale handle
    ta.add_columns(("coupon", pa.string()))
    ta.update({"coupon": "X"}, [("id", "<=", 2)])
    tb.append({"id": [4], "v": ["d"]})  # appends from the old schema still land (null coupon)
    before = ta.version
    with pytest.raises(errors.SchemaChangedConflict) as ei:
        tb.delete([("id", "=", 3)])
    assert isinstance(ei.value, errors.CommitConflict) and ei.value.other_operation == "ALTER"
    assert ei.value.other_version == 2  # the add_columns commit (version 1 appended), not the head
    assert ta.version == before  # nothing committed
    assert tb.schema.names == ["id", "v", "coupon"]  # the handle reloaded its schema: a retry works
    tb.delete([("id", "=", 3)])
    with pytest.raises(errors.SchemaChangedConflict):  # compaction by another stale handle
        stale = b.load_table("s.t")
        ta.add_columns(("n", pa.int64()))
        stale.compact()
    b.load_table("s.t").compact()
    assert _rows(ta) == [
        {"id": 1, "v": "a", "coupon": "X", "n": None},
        {"id": 2, "v": "b", "coupon": "X", "n": None},
        {"id": 4, "v": "d", "coupon": None, "n": None},
    ]
    a.close()
    b.close()


def test_primary_key_table_gains_a_column(catalog: Catalog) -> None:
    catalog.create_namespace("s")
    t = catalog.create_table("s.k", BASE, primary_key=["id"])
    t.upsert({"id": [1, 2], "v": ["a", "b"]})
    t.add_columns(("score", pa.float64()))
    t.upsert({"id": [2, 3], "v": ["B", "c"], "score": [0.5, 1.5]})
    t.delete([("id", "=", 1)])
    assert _rows(t) == [{"id": 2, "v": "B", "score": 0.5}, {"id": 3, "v": "c", "score": 1.5}]
    t.compact(major=True)
    assert _rows(t) == [{"id": 2, "v": "B", "score": 0.5}, {"id": 3, "v": "c", "score": 1.5}]


def test_upgrade_adds_schema_id_to_a_version_4_catalog(catalog_spec) -> None:  # type: ignore[no-untyped-def]
    backend = create_backend(catalog_spec.url)
    with backend.write() as conn:
        M.upgrade(conn, target=4)
        conn.exec_driver_sql("ALTER TABLE ls_table DROP COLUMN schema_id")  # as version 4 created it
    backend.dispose()
    cat = catalog_spec.open()
    with cat.backend.read() as conn:
        assert M.current_version(conn) == M.LATEST
        assert "schema_id" in {c["name"] for c in sa.inspect(conn).get_columns("ls_table")}
    cat.create_namespace("s")
    t = cat.create_table("s.t", BASE)
    t.add_columns(("w", pa.int64()))
    assert cat.load_table("s.t").meta.schema_id == 1
    cat.close()
