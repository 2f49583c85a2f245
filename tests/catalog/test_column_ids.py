"""Column ids (issue 35, catalog/columns.py), on both backends.

* Every column, nested fields and a primary-key table's tombstone included, has an id from
  the table's creation; an added column takes a new one; ids survive reopening the catalog.
* Every file every write path writes (append, upsert, overwrite, delete and update
  rewrites, compaction) carries the catalog's ids as Parquet field ids.
* A catalog made by the release before ids (schema version 10, run from that commit's
  code in its own process) upgrades: ids by position, the name mapping recorded, every
  read equal to what the old release read, new files with ids, old ones without.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakestep import Catalog
from lakestep.catalog import migrations as M
from lakestep.catalog import schema as S
from lakestep.catalog.columns import ColumnIds, assign, file_ids, schema_with_ids
from tests.conftest import CatalogSpec

ROOT = Path(__file__).resolve().parents[2]
#: the last commit whose catalog has no column ids (metadata schema version 10)
BEFORE_IDS = "850a24730ac1d434ac893b5781a92f61f23d42f4"

NESTED = pa.schema([
    pa.field("id", pa.int64(), nullable=False), ("name", pa.string()),
    ("addr", pa.struct([("city", pa.string()), ("zip", pa.list_(pa.int32()))])),
    ("attrs", pa.map_(pa.string(), pa.int64())), ("n", pa.int64()),
])


def rows(first: int, n: int = 3) -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table({"id": ids, "name": [f"n{i}" for i in ids],
                     "addr": [{"city": f"c{i % 2}", "zip": [i, i + 1]} for i in ids],
                     "attrs": [[("k", i)] for i in ids], "n": ids}, schema=NESTED)


def test_ids_are_assigned_at_creation_and_never_reused(catalog: Catalog, catalog_spec: CatalogSpec) -> None:
    catalog.create_namespace("c")
    t = catalog.create_table("c.t", NESTED)
    assert dict(t.meta.column_ids.ids) == {
        ("id",): 1, ("name",): 2, ("addr",): 3, ("addr", "city"): 4, ("addr", "zip"): 5,
        ("addr", "zip", "element"): 6, ("attrs",): 7, ("attrs", "key"): 8, ("attrs", "value"): 9, ("n",): 10}
    assert t.meta.column_ids.last == 10
    k = catalog.create_table("c.k", NESTED, primary_key=["id"])
    assert k.meta.column_ids.ids[("_ls_deleted",)] == 11 and k.meta.column_ids.last == 11
    t.add_columns(("coupon", pa.string()), ("tags", pa.list_(pa.string())))
    k.add_columns(("coupon", pa.string()))
    assert t.meta.column_ids.ids[("coupon",)] == 11 and t.meta.column_ids.ids[("tags", "element")] == 13
    assert k.meta.column_ids.ids[("coupon",)] == 12  # after the tombstone's: never reused
    again = catalog_spec.open()
    try:
        assert again.load_table("c.t").meta.column_ids == t.meta.column_ids
        assert again.load_table("c.k").meta.column_ids == k.meta.column_ids
    finally:
        again.close()


def test_assign_keeps_known_ids_and_forgets_none() -> None:
    first = assign(NESTED)
    grown = assign(pa.schema([*NESTED, ("extra", pa.int32())]), first)
    assert {p: grown.ids[p] for p in first.ids} == dict(first.ids) and grown.ids[("extra",)] == first.last + 1
    # a column gone from the schema loses its id, and the counter does not come back down
    fewer = assign(pa.schema([f for f in NESTED if f.name != "n"]), grown)
    assert ("n",) not in fewer.ids and fewer.last == grown.last
    back = assign(NESTED, fewer)
    assert back.ids[("n",)] == grown.last + 1  # the same name again is a new column
    assert ColumnIds.from_json(back.to_json(), back.last) == back
    assert file_ids(schema_with_ids(NESTED, back)) == dict(back.ids)


def _file_ids_of(t) -> list[dict]:  # type: ignore[no-untyped-def]
    return [file_ids(pq.read_schema(os.path.join(t.location, f.path))) for f in t.files()]


def test_every_write_path_writes_the_ids(catalog: Catalog) -> None:
    catalog.create_namespace("w")
    t = catalog.create_table("w.plain", NESTED, partition_by=["name"])
    k = catalog.create_table("w.keyed", NESTED, primary_key=["id"])
    t.append(rows(0))
    t.append(rows(3))
    t.delete([("id", "=", 1)])  # copy-on-write rewrite
    t.update({"n": 7}, [("id", "=", 2)])
    t.overwrite(rows(11, 1), where=[("name", "=", "n11")])
    t.compact()
    k.upsert(rows(0))
    k.upsert(rows(1, 2))
    k.delete([("id", "=", 0)])
    k.compact()
    t.add_columns(("coupon", pa.string()))
    t.append(pa.table({"id": [99], "coupon": ["x"]}))
    for table in (t, k):
        table.refresh()
        want = dict(table.meta.column_ids.ids)
        got = _file_ids_of(table)
        assert got and all(g == want or g == {p: i for p, i in want.items() if p != ("coupon",)} for g in got), \
            (table.ident, got, want)
    assert any(("coupon",) in g for g in _file_ids_of(t))  # the added column's id, in the newest file
    # reading back by name is unchanged, the ids stay out of the rows' schema
    assert t.to_arrow().schema.field("id").metadata is None
    assert sorted(k.to_arrow().column("id").to_pylist()) == [1, 2]


# ------------------------------------------------------------------ upgrade
MAKE_OLD = r'''
import json, sys
import pyarrow as pa
from lakestep import Catalog
url, wh, out = sys.argv[1:4]
cat = Catalog(url, warehouse=wh)
cat.create_namespace("u")
schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()),
                    ("addr", pa.struct([("city", pa.string()), ("zip", pa.list_(pa.int32()))]))])
def rows(first, n=3):
    ids = list(range(first, first + n))
    return pa.table({"id": ids, "name": [f"n{i}" for i in ids],
                     "addr": [{"city": f"c{i}", "zip": [i]} for i in ids]}, schema=schema)
t = cat.create_table("u.plain", schema, partition_by=["name"])
t.append(rows(0)); t.append(rows(3)); t.delete([("id", "=", 4)])
t.add_columns(("coupon", pa.string()))
t.append(pa.table({"id": [50], "coupon": ["c"]}))
k = cat.create_table("u.keyed", pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())]),
                     primary_key=["id"])
k.upsert(pa.table({"id": [1, 2], "v": ["a", "b"]})); k.upsert(pa.table({"id": [2], "v": ["B"]}))
reads = {name: {"head": cat.load_table(name).to_arrow().sort_by("id").to_pylist(),
                "v1": cat.load_table(name).to_arrow(version=1).sort_by("id").to_pylist()}
         for name in ("u.plain", "u.keyed")}
json.dump(reads, open(out, "w"), default=str)
cat.close()
'''


@pytest.fixture(scope="module")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lakestep package of :data:`BEFORE_IDS`, taken from this repository's history."""
    dest = tmp_path_factory.mktemp("before-ids")
    archive = dest / "src.tar"
    proc = subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), BEFORE_IDS, "lakestep"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"the upgrade test needs the repository's history (commit {BEFORE_IDS[:12]}): {proc.stderr}")
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest


def test_upgrade_from_the_release_before_ids(catalog_spec: CatalogSpec, old_release: Path, tmp_path: Path) -> None:
    out = tmp_path / "reads.json"
    script = tmp_path / "make_old.py"
    script.write_text(MAKE_OLD)
    env = {**os.environ, "PYTHONPATH": str(old_release)}
    proc = subprocess.run([sys.executable, str(script), catalog_spec.url, catalog_spec.warehouse, str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    old_reads = json.loads(out.read_text())
    cat = catalog_spec.open()  # upgrades the catalog to this release's schema
    try:
        with cat.backend.read() as conn:
            assert M.current_version(conn) == M.LATEST
        plain, keyed = cat.load_table("u.plain"), cat.load_table("u.keyed")
        # ids by position over the schema at the upgrade; the name mapping is that same mapping
        assert dict(plain.meta.column_ids.ids) == {("id",): 1, ("name",): 2, ("addr",): 3, ("addr", "city"): 4,
                                                   ("addr", "zip"): 5, ("addr", "zip", "element"): 6,
                                                   ("coupon",): 7}
        assert dict(keyed.meta.column_ids.ids) == {("id",): 1, ("v",): 2, ("_ls_deleted",): 3}
        with cat.backend.read() as conn:
            mapping = conn.execute(S.tables.select().where(S.tables.c.table_id == plain.table_id)).mappings().one()
        assert ColumnIds.from_json(mapping["name_mapping"], 0).ids == plain.meta.column_ids.ids
        # every read equals the old release's, at the head and in the past
        for name, t in (("u.plain", plain), ("u.keyed", keyed)):
            assert json.loads(json.dumps(t.to_arrow().sort_by("id").to_pylist(), default=str)) == \
                old_reads[name]["head"], name
            assert json.loads(json.dumps(t.to_arrow(version=1).sort_by("id").to_pylist(), default=str)) == \
                old_reads[name]["v1"], name
        assert all(ids == {} for ids in _file_ids_of(plain))  # the old files: found by name
        before = {f.path for f in plain.files()}
        plain.append(pa.table({"id": [60], "name": ["x"], "coupon": ["d"]}))
        new = [f for f in plain.files() if f.path not in before]
        assert new and all(file_ids(pq.read_schema(os.path.join(plain.location, f.path))) ==
                           dict(plain.meta.column_ids.ids) for f in new)
        assert sorted(plain.to_arrow().column("id").to_pylist()) == [0, 1, 2, 3, 5, 50, 60]
        plain.add_columns(("later", pa.int32()))
        assert plain.meta.column_ids.ids[("later",)] == 8
        # renames over the old files (no field ids: found by their stored names), time travel before them
        want = {r["id"]: r["name"] for r in plain.to_arrow().to_pylist()}
        v = plain.version
        plain.rename_column("name", "label")
        plain.rename_column("addr.city", "town")
        plain.drop_column("coupon")
        got = plain.to_arrow().to_pylist()
        assert {r["id"]: r["label"] for r in got} == want and "coupon" not in plain.to_arrow().column_names
        assert [r["addr"] for r in sorted(got, key=lambda r: r["id"])][:1] == [
            {"town": old_reads["u.plain"]["head"][0]["addr"]["city"], "zip": old_reads["u.plain"]["head"][0]["addr"]["zip"]}]
        assert plain.to_arrow(version=v).column_names == ["id", "name", "addr", "coupon", "later"]
        assert plain.to_arrow(where=[("label", "=", want[0])]).column("id").to_pylist() == [0]
    finally:
        cat.close()


def test_iceberg_field_ids_are_the_column_ids(catalog: Catalog) -> None:
    """Publishing gives each Iceberg field the catalog's id (the files carry them as Parquet
    field ids, which Iceberg readers resolve by), and PyIceberg reads the rows back."""
    from lakestep.barrier import OPEN_EPOCH, Pipeline, sealing
    from lakestep.iceberg import Publisher, sql_catalog
    from lakestep.iceberg.mapping import ids_of

    catalog.create_namespace("i")
    t = catalog.create_table("i.t", NESTED)
    Pipeline(catalog).register_job("feed", sinks=["i.t"], external_input=True)
    t.append(rows(0), barrier=OPEN_EPOCH)
    t.add_columns(("coupon", pa.string()))
    t.append(pa.table({"id": [9], "coupon": ["c"]}), barrier=OPEN_EPOCH)
    sealing.seal(catalog, sealing.acquire(catalog, "test", 1e9), 1e9)
    pub = Publisher(catalog)
    try:
        assert not pub.publish_once().errors
        ice = sql_catalog(catalog).load_table("i.t")
        assert ids_of(ice.schema()) == dict(t.meta.column_ids.ids)
        got = ice.scan().to_arrow().sort_by("id")
        assert got.column("id").to_pylist() == [0, 1, 2, 9]
        assert got.column("coupon").to_pylist() == [None, None, None, "c"]
        assert got.column("addr").to_pylist()[1] == {"city": "c1", "zip": [1, 2]}
    finally:
        pub.close()
