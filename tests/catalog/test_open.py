"""Opening a catalog: lakestep creates its schema only in an empty database, refuses
anything else with a typed error, and changes nothing while refusing."""

from __future__ import annotations

import sqlite3

import pyarrow as pa
import pytest
import sqlalchemy as sa

from lakestep import Catalog, errors
from lakestep.catalog import schema as S

SCHEMA = pa.schema([("id", pa.int64())])


def _catalog_with_data(wh) -> None:  # type: ignore[no-untyped-def]
    cat = Catalog(warehouse=str(wh))
    cat.create_namespace("s")
    cat.create_table("s.t", SCHEMA).append({"id": [1, 2]})
    cat.close()


def test_a_zero_byte_catalog_beside_table_data_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    wh = tmp_path / "wh"
    _catalog_with_data(wh)
    for suffix in ("-wal", "-shm"):
        (wh / f"catalog.db{suffix}").unlink(missing_ok=True)
    (wh / "catalog.db").write_bytes(b"")  # truncated by a crash or a bad copy
    with pytest.raises(errors.CatalogCorruptError, match="0 bytes"):
        Catalog(warehouse=str(wh))
    assert (wh / "catalog.db").stat().st_size == 0  # nothing was created in it


def test_a_new_catalog_may_start_from_an_empty_file_in_an_empty_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / "catalog.db").write_bytes(b"")
    cat = Catalog(warehouse=str(wh))
    cat.create_namespace("s")
    assert cat.list_namespaces() == ["s"]
    cat.close()


def test_a_sqlite_file_of_another_application_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE ls_table (id INTEGER PRIMARY KEY, label TEXT)")
        c.execute("INSERT INTO ls_table VALUES (1, 'not lakestep')")
    with pytest.raises(errors.CatalogCorruptError, match="ls_table"):
        Catalog(f"sqlite:///{path}", warehouse=str(tmp_path / "wh"))
    with sqlite3.connect(path) as c:  # untouched: no ALTER, no lakestep tables
        assert [r[1] for r in c.execute("PRAGMA table_info(ls_table)")] == ["id", "label"]
        assert [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["ls_table"]


def test_a_postgres_schema_with_a_foreign_ls_table_is_refused(pg_spec, pg_admin) -> None:  # type: ignore[no-untyped-def]
    schema = sa.make_url(pg_spec.url).query["options"].split("=")[-1]
    with pg_admin.connect() as c:
        c.execute(sa.text(f"CREATE TABLE {schema}.ls_table (id int, label text)"))
        c.execute(sa.text(f"CREATE TABLE {schema}.orders (id int)"))  # other applications' tables are fine
    with pytest.raises(errors.CatalogCorruptError, match="ls_table"):
        pg_spec.open()
    with pg_admin.connect() as c:
        cols = [r[0] for r in c.execute(sa.text(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = :s AND table_name = 'ls_table' "
            "ORDER BY ordinal_position"), {"s": schema})]
        tables = {r[0] for r in c.execute(sa.text(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = :s"), {"s": schema})}
    assert cols == ["id", "label"] and tables == {"ls_table", "orders"}


def test_other_applications_tables_do_not_stop_a_postgres_catalog(pg_spec, pg_admin) -> None:  # type: ignore[no-untyped-def]
    schema = sa.make_url(pg_spec.url).query["options"].split("=")[-1]
    with pg_admin.connect() as c:
        c.execute(sa.text(f"CREATE TABLE {schema}.orders (id int)"))
    cat = pg_spec.open()
    cat.create_namespace("s")
    cat.close()


@pytest.mark.parametrize("value", [None, "abc", "0"])
def test_a_bad_schema_version_is_refused(catalog_spec, value) -> None:  # type: ignore[no-untyped-def]
    cat = catalog_spec.open()
    cat.create_namespace("s")
    with cat.backend.write() as conn:
        if value is None:
            conn.execute(sa.delete(S.meta).where(S.meta.c.key == "schema_version"))
        else:
            conn.execute(sa.update(S.meta).where(S.meta.c.key == "schema_version").values(value=value))
    cat.close()
    with pytest.raises(errors.CatalogCorruptError, match="schema_version"):
        catalog_spec.open()


def test_a_corrupt_sqlite_file_is_a_typed_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / "catalog.db").write_bytes(b"this is not a database file at all\n" * 200)
    with pytest.raises(errors.CatalogCorruptError):
        Catalog(warehouse=str(wh))


def test_a_warehouse_that_is_a_file_is_a_typed_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "wh").write_text("a file")
    with pytest.raises(errors.InvalidLocationError):
        Catalog(warehouse=str(tmp_path / "wh"))
    with pytest.raises(errors.InvalidLocationError):
        Catalog(warehouse=str(tmp_path / "wh" / "below"))


def test_metadata_work_imports_no_dataset_or_pandas() -> None:
    """A process that opens a catalog, makes tables, registers jobs, seals and plans (a CLI command,
    the coordinator) does not import pyarrow.dataset, which imports pandas (0.4 s a process):
    lakestep imports it where it scans files (catalog/reader.py). pyarrow itself imports both where a
    plan's filter is checked against the schema (Acero) and where data comes as Python lists (its
    conversion looks for pandas objects)."""
    import subprocess
    import sys

    code = ("import sys, tempfile, pyarrow as pa\n"
            "from lakestep import Catalog, Coordinator, Pipeline\n"
            "cat = Catalog(warehouse=tempfile.mkdtemp())\n"
            "cat.create_namespace('s')\n"
            "t = cat.create_table('s.t', pa.schema([('id', pa.int64())]))\n"
            "p = Pipeline(cat)\n"
            "p.register_job('j', sinks=['s.t'], external_input=True)\n"
            "coord = Coordinator(cat, interval=3600)\n"
            "assert coord.acquire() and coord.seal() is not None\n"
            "assert t.files() == [] and t.read_plan().files == () and cat.list_tables('s') == ['s.t']\n"
            "bad = sorted(m for m in ('pyarrow.dataset', 'pandas', 'pyspark') if m in sys.modules)\n"
            "assert not bad, bad\n"
            "t.append({'id': [1, 2]})\n"
            "assert t.to_arrow()['id'].to_pylist() == [1, 2] and 'pyarrow.dataset' in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
