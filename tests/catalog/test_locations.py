"""Table locations never overlap, and purge and cleanup delete only a table's own files (issue 9, item 2).

Catalogs made before the check may already hold overlapping tables: those
are made here by moving a table's location with SQL, as an older lakestep
would have stored it.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
import sqlalchemy as sa

from lakestep import Catalog, errors
from lakestep.catalog import schema as S

SCHEMA = pa.schema([("id", pa.int64())])


def files_under(path: str) -> set[str]:
    return {os.path.relpath(os.path.join(r, f), path) for r, _, fs in os.walk(path) for f in fs}


def stored_location(catalog: Catalog, ident: str, location: str) -> None:
    """Store ``location`` for ``ident`` as a lakestep without the overlap check would have."""
    ns, name = ident.split(".")
    with catalog.backend.write() as conn:
        conn.execute(sa.update(S.tables).where(S.tables.c.namespace == ns, S.tables.c.name == name)
                     .values(location=location))


def ids(t) -> list[int]:  # type: ignore[no-untyped-def]
    return sorted(t.to_arrow().column("id").to_pylist())


@pytest.fixture
def ns(catalog: Catalog) -> Catalog:
    catalog.create_namespace("s")
    return catalog


def test_location_at_the_warehouse_root_is_refused(ns: Catalog) -> None:
    before = files_under(ns.warehouse)
    for external in (False, True):
        with pytest.raises(errors.LocationOverlapError) as ei:
            ns.create_table("s.root", SCHEMA, location=ns.warehouse, external=external)
        assert ei.value.other == "the warehouse root"
    with pytest.raises(errors.LocationOverlapError):  # an ancestor of the warehouse holds it too
        ns.create_table("s.up", SCHEMA, location=os.path.dirname(ns.warehouse), external=True)
    assert ns.list_tables() == [] and files_under(ns.warehouse) == before


def test_location_inside_or_around_another_table_is_refused(ns: Catalog) -> None:
    a = ns.create_table("s.a", SCHEMA)
    a.append({"id": [1]})
    for bad in (a.location, os.path.join(a.location, "data", "x"), os.path.dirname(a.location)):
        with pytest.raises(errors.LocationOverlapError) as ei:
            ns.create_table("s.b", SCHEMA, location=bad)
        assert ei.value.other == "table s.a"
    assert ns.list_tables() == ["s.a"]
    assert not os.path.exists(os.path.join(a.location, "data", "x"))  # no directory made for a refused table
    assert ids(a) == [1]


def test_a_symlink_inside_the_warehouse_is_judged_by_where_it_points(ns: Catalog, tmp_path) -> None:  # type: ignore[no-untyped-def]
    a = ns.create_table("s.a", SCHEMA)
    to_a = os.path.join(ns.warehouse, "to-a")
    os.symlink(a.location, to_a)
    with pytest.raises(errors.LocationOverlapError) as ei:  # the string is fresh, the place is s.a's
        ns.create_table("s.b", SCHEMA, location=os.path.join(to_a, "data", "b"))
    assert ei.value.other_location == os.path.realpath(a.location)
    outside = tmp_path / "outside"
    outside.mkdir()
    out = os.path.join(ns.warehouse, "out")
    os.symlink(outside, out)
    with pytest.raises(errors.InvalidLocationError, match="outside the warehouse"):
        ns.create_table("s.c", SCHEMA, location=os.path.join(out, "c"))
    assert ns.list_tables() == ["s.a"] and list(outside.iterdir()) == []


def test_location_holding_the_sqlite_catalog_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    db_dir = tmp_path / "db"
    with Catalog(f"sqlite:///{db_dir}/catalog.db", warehouse=str(tmp_path / "wh")) as cat:
        cat.create_namespace("s")
        with pytest.raises(errors.LocationOverlapError) as ei:
            cat.create_table("s.t", SCHEMA, location=str(db_dir), external=True)
        assert ei.value.other == "the catalog file"
        assert cat.list_tables() == []
    assert (db_dir / "catalog.db").exists()


def test_cleanup_keeps_the_files_of_a_table_inside_its_data(ns: Catalog) -> None:
    """Before the fix, s.a's cleanup deleted s.b's committed files as orphans."""
    a = ns.create_table("s.a", SCHEMA, properties={"lakestep.retention-seconds": "0"})
    a.append({"id": [1]})
    ns.create_table("s.b", SCHEMA)
    stored_location(ns, "s.b", os.path.join(a.location, "data", "x"))
    b = ns.load_table("s.b")
    b.append({"id": [2]})
    b_files = files_under(b.location)
    for rel in b_files:  # old files: no age floor could save them
        os.utime(os.path.join(b.location, rel), (1e9, 1e9))
    report = a.cleanup()
    assert report.orphan_files == []
    assert files_under(b.location) == b_files
    assert ids(b) == [2] and ids(a) == [1]


def test_purge_of_a_table_at_the_warehouse_root_deletes_only_its_files(catalog_spec) -> None:  # type: ignore[no-untyped-def]
    """Before the fix, the purge deleted the whole warehouse, catalog.db included."""
    cat = catalog_spec.open()
    cat.create_namespace("s")
    other = cat.create_table("s.other", SCHEMA)  # first: no table can be created inside s.root's location
    other.append({"id": [2]})
    cat.create_table("s.root", SCHEMA)
    stored_location(cat, "s.root", cat.warehouse)
    root = cat.load_table("s.root")
    root.append({"id": [1]})
    other_files = files_under(other.location)
    keep = os.path.join(cat.warehouse, "notes.txt")  # not the table's: purge must not touch it
    with open(keep, "w") as f:
        f.write("mine")
    cat.drop_table("s.root", purge=True)
    assert os.path.exists(keep) and files_under(other.location) == other_files
    assert not os.path.exists(os.path.join(cat.warehouse, "data"))
    cat.close()
    with catalog_spec.open() as again:  # the catalog (catalog.db on SQLite) is intact
        assert again.list_tables() == ["s.other"] and ids(again.load_table("s.other")) == [2]


def test_purge_deletes_recorded_files_and_data_orphans_only(ns: Catalog) -> None:
    t = ns.create_table("s.t", SCHEMA, partition_by=["id"])
    t.append({"id": [1, 2]})
    t.overwrite({"id": [3]})  # removed files are still on disk: recorded, purged too
    orphan = os.path.join(t.location, "data", "id=9", "orphan.parquet")
    os.makedirs(os.path.dirname(orphan))
    with open(orphan, "wb") as f:
        f.write(b"x")
    readme = os.path.join(t.location, "README")  # beside data/: not the table's to delete
    with open(readme, "w") as f:
        f.write("hands off")
    ns.drop_table("s.t", purge=True)
    assert files_under(t.location) == {"README"}


def test_purge_keeps_a_table_nested_in_its_data(ns: Catalog) -> None:
    a = ns.create_table("s.a", SCHEMA)
    a.append({"id": [1]})
    ns.create_table("s.b", SCHEMA)
    stored_location(ns, "s.b", os.path.join(a.location, "data", "b"))
    b = ns.load_table("s.b")
    b.append({"id": [2]})
    ns.drop_table("s.a", purge=True)
    assert ids(b) == [2]
    assert files_under(a.location) == {os.path.join("data", "b", p) for p in files_under(b.location)}


def test_cleanup_and_purge_never_follow_a_symlink_out_of_data(ns: Catalog, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Before the fix, cleanup listed through a symlinked directory under data/ and deleted what it found."""
    t = ns.create_table("s.t", SCHEMA, properties={"lakestep.retention-seconds": "0"})
    t.append({"id": [1]})
    outside = tmp_path / "outside"
    outside.mkdir()
    precious = outside / "precious.parquet"
    precious.write_bytes(b"not the table's")
    os.utime(precious, (1e9, 1e9))  # old: no age floor could save it
    os.symlink(outside, os.path.join(t.location, "data", "link"))
    assert t.cleanup().orphan_files == []
    assert precious.exists() and ids(t) == [1]
    ns.drop_table("s.t", purge=True)
    assert precious.exists()
