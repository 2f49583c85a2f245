"""Namespaces and tables: create, load, list, rename, drop; identifiers and locations."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from lakestep import Catalog, errors

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def test_namespace_lifecycle(catalog: Catalog) -> None:
    catalog.create_namespace("a")
    catalog.create_namespace("b", {"owner": "me"})
    catalog.create_namespace("a", exist_ok=True)
    with pytest.raises(errors.NamespaceAlreadyExistsError):
        catalog.create_namespace("a")
    assert catalog.list_namespaces() == ["a", "b"]
    catalog.create_table("a.t", SCHEMA)
    with pytest.raises(errors.NamespaceNotEmptyError) as ei:
        catalog.drop_namespace("a")
    assert ei.value.tables == ["t"]
    catalog.drop_namespace("b")
    with pytest.raises(errors.NamespaceNotFoundError):
        catalog.drop_namespace("b")
    assert catalog.list_namespaces() == ["a"]


def test_table_lifecycle(catalog: Catalog) -> None:
    catalog.create_namespace("s")
    catalog.create_namespace("s2")
    t = catalog.create_table("s.orders", SCHEMA, properties={"owner": "ops"})
    assert t.version == 0 and t.data_version == 0
    assert t.schema.equals(SCHEMA)
    assert t.location.startswith(catalog.warehouse)
    with pytest.raises(errors.TableAlreadyExistsError):
        catalog.create_table("s.orders", SCHEMA)
    assert catalog.create_table("s.orders", SCHEMA, exist_ok=True).table_id == t.table_id
    t.append({"id": [1], "name": ["x"]})
    catalog.create_table("s.other", SCHEMA)
    assert catalog.list_tables() == ["s.orders", "s.other"]
    assert catalog.list_tables("s2") == []

    moved = catalog.rename_table("s.orders", "s2.orders")
    assert moved.table_id == t.table_id
    assert not catalog.table_exists("s.orders")
    assert moved.to_arrow().to_pylist() == [{"id": 1, "name": "x"}]
    assert t.to_arrow().num_rows == 1  # an old handle follows the table id
    with pytest.raises(errors.TableAlreadyExistsError):
        catalog.rename_table("s.other", "s2.orders")
    with pytest.raises(errors.NamespaceNotFoundError):
        catalog.rename_table("s.other", "nope.other")

    catalog.drop_table("s2.orders", purge=True)
    assert not os.path.exists(moved.location)
    with pytest.raises(errors.TableNotFoundError):
        catalog.load_table("s2.orders")
    with pytest.raises(errors.TableNotFoundError):
        t.append({"id": [2], "name": ["y"]})
    with pytest.raises(errors.TableNotFoundError):
        t.to_arrow()
    # same name again: a new table with its own location and history
    again = catalog.create_table("s2.orders", SCHEMA)
    assert again.table_id != t.table_id and again.to_arrow().num_rows == 0


def test_table_needs_namespace_and_valid_schema(catalog: Catalog) -> None:
    with pytest.raises(errors.NamespaceNotFoundError):
        catalog.create_table("missing.t", SCHEMA)
    catalog.create_namespace("s")
    with pytest.raises(errors.InvalidSchemaError):
        catalog.create_table("s.t", SCHEMA, partition_by=["nope"])
    with pytest.raises(errors.InvalidIdentifierError):
        catalog.create_table("s.t", pa.schema([("bad name", pa.int64())]))
    pk = catalog.create_table("s.pk", SCHEMA, primary_key=["id"])
    assert pk.primary_key == ["id"] and not pk.schema.field("id").nullable


@pytest.mark.parametrize(
    "ident",
    ["", "a", "a.b.c", ".t", "s.", 's."t"', "s.t;drop table ls_table", "s.t'", "s.1t", "s.t t",
     "s." + "x" * 129, ("s",), 42],
)
def test_bad_identifiers_are_refused(catalog: Catalog, ident: object) -> None:
    catalog.create_namespace("s")
    with pytest.raises(errors.InvalidIdentifierError):
        catalog.create_table(ident, SCHEMA)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidIdentifierError):
        catalog.load_table(ident)  # type: ignore[arg-type]
    assert catalog.list_tables() == []


def test_bad_namespace_names(catalog: Catalog) -> None:
    for bad in ["", "a;b", "a'b", 'a"b', "a.b", "a b", "x" * 129]:
        with pytest.raises(errors.InvalidIdentifierError):
            catalog.create_namespace(bad)
    assert catalog.list_namespaces() == []


def test_locations(catalog: Catalog, tmp_path) -> None:  # type: ignore[no-untyped-def]
    catalog.create_namespace("s")
    inside = os.path.join(catalog.warehouse, "custom", "place")
    t = catalog.create_table("s.inside", SCHEMA, location=inside)
    assert t.location == inside
    for bad in [str(tmp_path / "elsewhere"), os.path.join(catalog.warehouse, "..", "escape"),
                catalog.warehouse + "-sibling/t"]:
        with pytest.raises(errors.InvalidLocationError):
            catalog.create_table("s.bad", SCHEMA, location=bad)
    with pytest.raises(errors.InvalidLocationError):
        catalog.create_table("s.bad", SCHEMA, location="")
    with pytest.raises(errors.InvalidLocationError):
        catalog.create_table("s.bad", SCHEMA, location="bogus-scheme://x/y")
    with pytest.raises(errors.InvalidLocationError):  # two managed tables never share a place
        catalog.create_table("s.clash", SCHEMA, location=inside)
    ext = catalog.create_table("s.ext", SCHEMA, location=str(tmp_path / "elsewhere"), external=True)
    ext.append({"id": [1], "name": ["a"]})
    assert ext.to_arrow().num_rows == 1
    assert all(not os.path.isabs(f.path) and ".." not in f.path for f in ext.files())
    assert not catalog.table_exists("s.bad")


def test_reopen_finds_the_warehouse(catalog_spec) -> None:  # type: ignore[no-untyped-def]
    first = catalog_spec.open()
    first.create_namespace("s")
    first.create_table("s.t", SCHEMA).append({"id": [1], "name": ["a"]})
    first.close()
    again = Catalog(catalog_spec.url)  # the URL alone is enough
    assert again.warehouse == first.warehouse
    assert again.load_table("s.t").to_arrow().num_rows == 1
    with pytest.raises(errors.CatalogError):
        Catalog(catalog_spec.url, warehouse=first.warehouse + "-other")
    again.close()


def test_unreachable_database_is_a_typed_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(errors.CatalogUnavailableError):
        Catalog("postgresql://postgres@127.0.0.1:1/none", warehouse=str(tmp_path))
    with pytest.raises(errors.CatalogError):
        Catalog("mysql://x@localhost/db", warehouse=str(tmp_path))
    with pytest.raises(errors.CatalogError):
        Catalog("sqlite://", warehouse=str(tmp_path))
