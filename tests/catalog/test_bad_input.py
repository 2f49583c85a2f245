"""Bad input gets a typed error and changes nothing (issue 9, "Raw errors where a typed one is promised").

One table of cases: a call, the :class:`LakestepError` subclass it must raise,
and a check that nothing was committed or deleted: every table's version,
data version, live files and properties, the namespaces, and the files on
disk are the same before and after. Every case runs on SQLite and PostgreSQL.

Storage faults (disk full, read-only directories) are made real with a tmpfs
mounted for the test: they need root with CAP_SYS_ADMIN, and are skipped,
saying so, where ``mount`` is refused.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import subprocess
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, Iterator

import pyarrow as pa
import pytest

from lakestep import Catalog, errors
from lakestep.barrier import Pipeline
from lakestep.catalog.lifecycle import live_locks

# also the tables of tests/catalog/test_error_hierarchy.py
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("day", pa.string())])
ROWS = {"id": [1, 2, 3], "name": ["a", "b", "c"], "day": ["d1", "d1", "d2"]}


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[Catalog], Any]
    error: type[Exception]


def t(cat: Catalog) -> Any:
    return cat.load_table("s.t")


def pk(cat: Catalog) -> Any:
    return cat.load_table("s.pk")


def a_file(cat: Catalog) -> str:
    path = os.path.join(cat.warehouse, "a-file")
    with open(path, "w") as f:
        f.write("not a directory")
    return path


CASES = [
    # a filter value of the wrong type (was ArrowNotImplementedError)
    Case("filter-str-for-int", lambda c: t(c).to_arrow(where=[("id", "=", "abc")]), errors.FilterValueError),
    Case("filter-in-mixed", lambda c: t(c).to_arrow(where=[("id", "in", [1, "a"])]), errors.FilterValueError),
    Case("filter-delete", lambda c: t(c).delete([("id", "<", b"x")]), errors.FilterValueError),
    Case("filter-update", lambda c: t(c).update({"name": "z"}, [("day", ">", 5)]), errors.FilterValueError),
    Case("filter-pk-delete", lambda c: pk(c).delete([("id", "=", "1")]), errors.FilterValueError),
    Case("filter-overwrite-partition", lambda c: t(c).overwrite({"id": [9], "name": ["n"], "day": ["5"]},
                                                                  partitions=[{"day": 5}]), errors.FilterValueError),
    Case("update-value-type", lambda c: t(c).update({"id": "x"}, [("id", "=", 1)]), errors.SchemaMismatchError),
    Case("update-value-type-no-match", lambda c: t(c).update({"id": "x"}, [("id", "=", 99)]),
         errors.SchemaMismatchError),
    Case("update-pk-unknown-column", lambda c: pk(c).update({"nope": 1}, [("id", "=", 1)]),
         errors.SchemaMismatchError),
    # keys out of range (was OverflowError on SQLite, DataError on PostgreSQL)
    Case("batch-id-2**70", lambda c: t(c).append(ROWS, job_id="j", batch_id=2 ** 70), errors.InvalidArgumentError),
    Case("batch-id--2**64", lambda c: t(c).append(ROWS, job_id="j", batch_id=-2 ** 64), errors.InvalidArgumentError),
    Case("batch-id-str", lambda c: t(c).append(ROWS, job_id="j", batch_id="7"), errors.InvalidArgumentError),
    Case("batch-id-bool", lambda c: t(c).append(ROWS, job_id="j", batch_id=True), errors.InvalidArgumentError),
    Case("batch-id-float", lambda c: t(c).append(ROWS, job_id="j", batch_id=1.5), errors.InvalidArgumentError),
    Case("batch-id-no-job", lambda c: c.transaction(batch_id=1), errors.InvalidArgumentError),
    Case("job-id-int", lambda c: t(c).append(ROWS, job_id=5, batch_id=1), errors.InvalidIdentifierError),
    Case("job-id-list", lambda c: t(c).append(ROWS, job_id=["j"], batch_id=1), errors.InvalidIdentifierError),
    Case("barrier-2**70", lambda c: t(c).append(ROWS, barrier=2 ** 70), errors.InvalidArgumentError),
    Case("barrier--5", lambda c: t(c).append(ROWS, barrier=-5), errors.InvalidArgumentError),
    Case("snapshot-barrier-2**70", lambda c: t(c).create_snapshot("x", barrier=2 ** 70), errors.InvalidArgumentError),
    Case("version-at--5", lambda c: Pipeline(c).version_at("s.t", -5), errors.InvalidArgumentError),
    Case("states--1", lambda c: Pipeline(c).states("s.t", -1), errors.InvalidArgumentError),
    Case("rollback--1", lambda c: Pipeline(c).rollback(to=-1), errors.InvalidArgumentError),
    Case("cleanup-retention--5", lambda c: t(c).cleanup(retention_seconds=-5, force=True),
         errors.InvalidArgumentError),
    Case("lock-lease-nan", lambda c: t(c).lock(locker="r", lease_seconds=math.nan), errors.InvalidArgumentError),
    Case("isolation-bogus", lambda c: t(c).delete([("id", "=", 1)], isolation="bogus"), errors.InvalidArgumentError),
    # the warehouse or a location is a file, or lies under one
    Case("warehouse-is-a-file", lambda c: Catalog(warehouse=a_file(c)), errors.InvalidLocationError),
    Case("warehouse-under-a-file", lambda c: Catalog(warehouse=os.path.join(a_file(c), "wh")),
         errors.InvalidLocationError),
    Case("location-is-a-file", lambda c: c.create_table("s.new", SCHEMA, location=a_file(c)),
         errors.InvalidLocationError),
    Case("location-under-a-file", lambda c: c.create_table("s.new", SCHEMA, location=os.path.join(a_file(c), "x")),
         errors.InvalidLocationError),
    Case("location-overlaps", lambda c: c.create_table("s.new", SCHEMA, location=t(c).location + "/data/x"),
         errors.LocationOverlapError),
    # upsert without a key (was a plain ValueError)
    Case("upsert-no-key", lambda c: t(c).upsert(ROWS), errors.NoPrimaryKeyError),
    Case("tx-upsert-no-key", lambda c: c.transaction().upsert("s.t", ROWS), errors.NoPrimaryKeyError),
    # a key no upsert can match on (was accepted, then ArrowTypeError on the first upsert)
    Case("pk-list", lambda c: c.create_table("s.new", pa.schema([("k", pa.list_(pa.int64()))]), primary_key=["k"]),
         errors.InvalidSchemaError),
    Case("pk-struct", lambda c: c.create_table("s.new", pa.schema([("k", pa.struct([("a", pa.int64())]))]),
                                               primary_key=["k"]), errors.InvalidSchemaError),
    Case("pk-map", lambda c: c.create_table("s.new", pa.schema([("k", pa.map_(pa.string(), pa.int64()))]),
                                            primary_key=["k"]), errors.InvalidSchemaError),
    Case("pk-dictionary", lambda c: c.create_table(
        "s.new", pa.schema([("k", pa.dictionary(pa.int32(), pa.string()))]), primary_key=["k"]),
         errors.InvalidSchemaError),
    Case("pk-twice", lambda c: c.create_table("s.new", SCHEMA, primary_key=["id", "id"]), errors.InvalidSchemaError),
    Case("partition-by-a-string", lambda c: c.create_table("s.new", SCHEMA, partition_by="day"),
         errors.InvalidSchemaError),
    Case("duplicate-schema-columns", lambda c: c.create_table("s.new", pa.schema([("a", pa.int64()),
                                                                                   ("a", pa.int64())])),
         errors.InvalidSchemaError),
    Case("bad-property", lambda c: c.create_table("s.new", SCHEMA, properties={"lakestep.retention-seconds": "-5"}),
         errors.InvalidPropertyError),
    # input that is not a table (was ArrowInvalid, KeyError)
    Case("ragged-dict", lambda c: t(c).append({"id": [1, 2], "name": ["a"], "day": ["d", "d"]}),
         errors.InvalidDataError),
    Case("ragged-dict-pk", lambda c: pk(c).upsert({"id": [1], "name": ["a", "b"], "day": ["d"]}),
         errors.InvalidDataError),
    Case("scalar-column", lambda c: t(c).append({"id": 5, "name": "a", "day": "d"}), errors.InvalidDataError),
    Case("mixed-values", lambda c: t(c).append({"id": [1, "x"], "name": ["a", "b"], "day": ["d", "d"]}),
         errors.InvalidDataError),
    Case("duplicate-data-columns", lambda c: t(c).append(pa.Table.from_arrays(
        [pa.array([1]), pa.array(["a"]), pa.array(["d"]), pa.array(["e"])], names=["id", "name", "day", "day"])),
         errors.SchemaMismatchError),
    # schema changes the table cannot take (issue 35: Table.update_column)
    Case("narrow-int", lambda c: t(c).update_column("id", type=pa.int32()), errors.SchemaChangeError),
    Case("int-to-string", lambda c: t(c).update_column("id", type=pa.string()), errors.SchemaChangeError),
    Case("string-to-int", lambda c: t(c).update_column("name", type=pa.int64()), errors.SchemaChangeError),
    Case("narrow-float", lambda c: t(c).update_column("id", type=pa.float64()), errors.SchemaChangeError),
    Case("make-required", lambda c: t(c).update_column("name", nullable=False), errors.SchemaChangeError),
    Case("optional-pk", lambda c: pk(c).update_column("id", nullable=True), errors.SchemaChangeError),
    Case("change-unknown-column", lambda c: t(c).update_column("nope", type=pa.int64()), errors.SchemaChangeError),
    Case("change-nothing", lambda c: t(c).update_column("id"), errors.InvalidArgumentError),
    # renames, drops and nested adds the table cannot take (issue 35)
    Case("rename-unknown", lambda c: t(c).rename_column("nope", "x"), errors.SchemaChangeError),
    Case("rename-to-existing", lambda c: t(c).rename_column("id", "name"), errors.SchemaChangeError),
    Case("rename-to-reserved", lambda c: t(c).rename_column("id", "_ls_id"), errors.SchemaChangeError),
    Case("rename-to-bad-name", lambda c: t(c).rename_column("id", "bad name"), errors.InvalidIdentifierError),
    Case("rename-to-dotted", lambda c: t(c).rename_column("id", "a.b"), errors.InvalidIdentifierError),
    Case("rename-field-of-non-struct", lambda c: t(c).rename_column("id.x", "y"), errors.SchemaChangeError),
    Case("drop-pk-column", lambda c: pk(c).drop_column("id"), errors.SchemaChangeError),
    Case("drop-partition-column", lambda c: t(c).drop_column("day"), errors.SchemaChangeError),
    Case("drop-unknown", lambda c: t(c).drop_column("nope"), errors.SchemaChangeError),
    Case("drop-field-of-non-struct", lambda c: t(c).drop_column("name.x"), errors.SchemaChangeError),
    Case("add-field-to-non-struct", lambda c: t(c).add_columns(("name.x", pa.int64())), errors.SchemaChangeError),
    Case("add-field-bad-name", lambda c: t(c).add_columns(("name.bad name", pa.int64())),
         errors.InvalidIdentifierError),
]


def disk(warehouse: str) -> set[str]:
    """Every file under the warehouse but the SQLite catalog's own (catalog.db, -wal, -shm, .lock)."""
    out = set()
    for root, _, files in os.walk(warehouse):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), warehouse)
            if not rel.startswith("catalog.db") and rel != "a-file":
                out.add(rel)
    return out


def state(cat: Catalog) -> tuple[Any, ...]:
    tables = {}
    for ident in cat.list_tables():
        tb = cat.load_table(ident)
        tables[ident] = (tb.version, tb.data_version, sorted(f.path for f in tb.files()), tb.properties,
                         [s.name for s in tb.snapshots()])
    return cat.list_namespaces(), tables, len(live_locks(cat)), disk(cat.warehouse)


def with_tables(catalog: Catalog) -> Catalog:
    """The namespace s, with s.t (partitioned by day) and s.pk (keyed by id), both holding ROWS."""
    catalog.create_namespace("s")
    catalog.create_table("s.t", SCHEMA, partition_by=["day"]).append(ROWS)
    catalog.create_table("s.pk", SCHEMA, primary_key=["id"]).upsert(ROWS)
    return catalog


@pytest.fixture
def cat(shared_catalog: tuple[Any, Catalog]) -> Catalog:
    """The module's catalog of the backend (conftest.SharedCatalogs), made with_tables once: every case
    checks that it changed nothing, so the next case finds the same catalog as a fresh one."""
    catalog = shared_catalog[1]
    return catalog if "s" in catalog.list_namespaces() else with_tables(catalog)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_a_typed_error_and_changes_nothing(cat: Catalog, case: Case) -> None:
    before = state(cat)
    with pytest.raises(case.error) as ei:
        case.call(cat)
    assert isinstance(ei.value, errors.LakestepError) and str(ei.value)
    assert state(cat) == before


D1, D2 = dt.date(2020, 1, 1), dt.date(2020, 1, 2)
T1, T2 = dt.datetime(2020, 1, 1), dt.datetime(2020, 1, 2)
KEY_TYPES = [
    (pa.int8(), 1, 2), (pa.uint64(), 1, 2), (pa.float64(), 1.5, 2.5), (pa.decimal128(10, 2), Decimal("1.10"),
     Decimal("2.20")), (pa.bool_(), True, False), (pa.string(), "a", "b"), (pa.large_string(), "a", "b"),
    (pa.binary(), b"a", b"b"), (pa.large_binary(), b"a", b"b"), (pa.binary(3), b"abc", b"abd"),
    (pa.date32(), D1, D2), (pa.date64(), D1, D2), (pa.time32("s"), dt.time(1), dt.time(2)),
    (pa.time64("ns"), dt.time(1), dt.time(2)), (pa.timestamp("us"), T1, T2),
    (pa.timestamp("ns", tz="UTC"), T1.replace(tzinfo=dt.timezone.utc), T2.replace(tzinfo=dt.timezone.utc)),
]


@pytest.mark.parametrize("key_type,a,b", KEY_TYPES, ids=[str(k[0]) for k in KEY_TYPES])
def test_every_accepted_key_type_upserts_and_deletes(catalog: Catalog, key_type: pa.DataType, a: Any, b: Any) -> None:
    """The key types create_table accepts are the ones merge on read can match (the refused ones are above)."""
    catalog.create_namespace("s")
    tb = catalog.create_table("s.k", pa.schema([("k", key_type), ("v", pa.int64())]), primary_key=["k"])
    tb.upsert(pa.table({"k": pa.array([a, b], key_type), "v": [1, 2]}))
    tb.upsert(pa.table({"k": pa.array([b], key_type), "v": [3]}))
    assert sorted(tb.to_arrow().column("v").to_pylist()) == [1, 3]
    tb.delete([("k", "=", a)])
    assert tb.to_arrow().column("v").to_pylist() == [3]


# ------------------------------------------------------------- storage faults
@contextlib.contextmanager
def tmpfs(path: str, size: str) -> Iterator[str]:
    os.makedirs(path)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"a real storage fault needs a tmpfs mount, refused here: {r.stderr.strip()} (run as root "
                    "with CAP_SYS_ADMIN)")
    try:
        yield path
    finally:
        subprocess.run(["umount", path], check=True)


def remount(path: str, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", path], check=True)


@pytest.fixture
def on_tmpfs(catalog_spec, tmp_path) -> Iterator[tuple[Catalog, str]]:  # type: ignore[no-untyped-def]
    """A catalog whose warehouse is a 1 MiB tmpfs (the SQLite database itself stays off it)."""
    url = f"sqlite:///{tmp_path}/db/catalog.db" if catalog_spec.backend == "sqlite" else catalog_spec.url
    with tmpfs(str(tmp_path / "wh"), "1m") as wh:
        cat = Catalog(url, warehouse=wh)
        cat.create_namespace("s")
        cat.create_table("s.t", SCHEMA).append(ROWS)
        try:
            yield cat, wh
        finally:
            cat.close()
            remount(wh, "rw")


def test_disk_full_while_writing_is_a_storage_error(on_tmpfs) -> None:  # type: ignore[no-untyped-def]
    cat, _ = on_tmpfs
    big = {"id": [1, 2], "name": [os.urandom(1 << 20).hex()[: 1 << 20] for _ in range(2)], "day": ["d", "d"]}
    before = state(cat)
    with pytest.raises(errors.StorageError) as ei:
        cat.load_table("s.t").append(big)  # 2 MiB of incompressible text into 1 MiB
    assert ei.value.errno == 28 and "full" in str(ei.value)
    assert state(cat) == before  # no row, and no partial file left behind
    cat.load_table("s.t").append(ROWS)  # the space came back with the partial file
    assert cat.load_table("s.t").count() == 6


def test_read_only_storage_is_a_storage_error(on_tmpfs) -> None:  # type: ignore[no-untyped-def]
    """Before the fix, create_table committed the row and then failed to make the directory:
    a table listed but unusable."""
    cat, wh = on_tmpfs
    remount(wh, "ro")
    before = state(cat)
    with pytest.raises(errors.StorageError) as ei:
        cat.create_table("s.new", SCHEMA)
    assert ei.value.errno == 30 and "read-only" in str(ei.value)
    with pytest.raises(errors.StorageError):
        cat.load_table("s.t").append(ROWS)
    assert state(cat) == before and cat.list_tables() == ["s.t"]
    assert cat.load_table("s.t").count() == 3  # reads still work
