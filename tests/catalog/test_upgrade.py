"""The catalog's metadata schema: created, versioned, upgraded, and refused when too new."""

from __future__ import annotations

import contextlib
import json

import pyarrow as pa
import pytest
import sqlalchemy as sa

from lakestep import Catalog, errors
from lakestep.catalog import migrations as M
from lakestep.catalog import schema as S
from lakestep.catalog.backend import create_backend
from lakestep.catalog.lifecycle import live_locks


@pytest.mark.parametrize("start", range(0, M.LATEST))
def test_upgrade_from_every_older_version(catalog_spec, start: int) -> None:  # type: ignore[no-untyped-def]
    backend = create_backend(catalog_spec.url)
    with backend.write() as conn:
        assert M.upgrade(conn, target=start) == start
    backend.dispose()
    cat = catalog_spec.open()
    with cat.backend.read() as conn:
        assert M.current_version(conn) == M.LATEST
    cat.create_namespace("s")
    t = cat.create_table("s.t", pa.schema([("id", pa.int64())]))
    t.append({"id": [1]})
    assert t.to_arrow().num_rows == 1
    cat.close()


def _plain(found: object) -> str:
    """An inspector's answer as text (a partial index's WHERE clause is a SQL element: its SQL)."""
    if isinstance(found, dict):
        return "{" + ", ".join(f"{k}: {_plain(v)}" for k, v in sorted(found.items())) + "}"
    if isinstance(found, (list, tuple)):
        return "[" + ", ".join(_plain(v) for v in found) + "]"
    return str(found) if isinstance(found, sa.sql.ClauseElement) else repr(found)


def _shape(engine: sa.Engine) -> dict[str, object]:
    """Everything of a catalog's metadata schema a migration could make: tables, columns (type,
    nullability, default), keys, indexes, views, and the rows of the one-row tables (times left out)."""
    times = {"opened_at", "updated_at"}
    with engine.connect() as conn:
        insp = sa.inspect(conn)
        names = sorted(n for n in insp.get_table_names() if n.startswith("ls_"))
        shape: dict[str, object] = {"tables": names, "views": {
            v: insp.get_view_definition(v) for v in sorted(insp.get_view_names()) if v.startswith("ls_")}}
        for n in names:
            shape[n] = {
                "columns": [(c["name"], str(c["type"]), c["nullable"], c.get("default"), c.get("autoincrement"))
                            for c in insp.get_columns(n)],
                "pk": insp.get_pk_constraint(n)["constrained_columns"],
                "indexes": sorted(_plain(i) for i in insp.get_indexes(n)),
                "unique": sorted(_plain(u) for u in insp.get_unique_constraints(n)),
            }
        for n in ("ls_meta", "ls_epoch", "ls_topology", "ls_coordinator", "ls_publisher"):
            rows = conn.execute(sa.text(f"SELECT * FROM {n}")).mappings().all()
            shape[f"{n} rows"] = sorted(repr(sorted((k, v) for k, v in r.items() if k not in times)) for r in rows)
    return shape


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_new_catalog_equals_every_migration_replayed(backend: str, tmp_path, request) -> None:  # type: ignore[no-untyped-def]
    """A new catalog is made at the newest version in one pass (schema.create_latest); it must be
    exactly what replaying every migration on an empty database makes."""
    from tests.conftest import _pg_spec

    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            urls = [f"sqlite:///{tmp_path / 'replayed.db'}", f"sqlite:///{tmp_path / 'new.db'}"]
        else:
            admin = request.getfixturevalue("pg_admin")
            urls = [stack.enter_context(_pg_spec(admin, str(tmp_path / f"w{i}"))).url for i in range(2)]
        replayed = create_backend(urls[0])
        with replayed.write() as conn:
            assert M.upgrade(conn) == M.LATEST
            conn.execute(sa.insert(S.meta).values(key="warehouse", value=str(tmp_path / "w")))
        new = Catalog(urls[1], warehouse=str(tmp_path / "w"))
        a, b = _shape(replayed.engine), _shape(new.backend.engine)
        replayed.dispose()
        new.close()
    assert a["tables"] == b["tables"] and len(a["tables"]) > 20  # type: ignore[arg-type]
    for key in a:
        assert a[key] == b[key], key
    assert a == b


def test_newer_catalog_is_refused(catalog_spec) -> None:  # type: ignore[no-untyped-def]
    cat = catalog_spec.open()
    with cat.backend.write() as conn:
        conn.execute(sa.update(S.meta).where(S.meta.c.key == "schema_version").values(value=str(M.LATEST + 1)))
    cat.close()
    with pytest.raises(errors.CatalogVersionError) as ei:
        catalog_spec.open()
    assert ei.value.found == M.LATEST + 1 and ei.value.supported == M.LATEST


def test_open_without_create(catalog_spec) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(errors.CatalogError):
        catalog_spec.open(create=False)
    catalog_spec.open().close()
    catalog_spec.open(create=False).close()


# ------------------------------------------------------------ upgrades with data
T0 = 1_600_000_000.0
DATA_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def _parquet(location: str, name: str, ids: list[int], names: list[str]) -> dict[str, object]:
    """A data file as lakestep writes it, and its ``ls_file`` columns."""
    import os

    import pyarrow.parquet as pq

    rel = f"data/{name}.parquet"
    os.makedirs(os.path.join(location, "data"), exist_ok=True)
    pq.write_table(pa.table({"id": ids, "name": names}, schema=DATA_SCHEMA), os.path.join(location, rel))
    stats = {"id": [min(ids), max(ids), 0], "name": [min(names), max(names), 0]}
    return {"path": rel, "record_count": len(ids), "file_size": os.path.getsize(os.path.join(location, rel)),
            "partition": "{}", "stats": json.dumps(stats, separators=(",", ":")), "source_ids": None, "seq": None}


def _write_as_version(conn: sa.Connection, version: int, warehouse: str) -> None:
    """The rows a catalog at metadata schema ``version`` held for: namespace s, table s.t
    with three commits (append [1, 2] under key (j, 7); append [3] under (j, 8);
    delete id 1, rewriting the first file to [2]); from version 2 a snapshot of
    version 2 and a lock of version 1, the second commit at barrier 1; from version 3
    job j writing s.t, barrier 1 sealed, a rollback record; at version 4 the job's
    trigger decisions (ls_job_trigger, which version 6 replaces), inserted neither
    in the order they were made nor in key order; from version 6 the same decisions
    in ls_trigger_decision."""
    location = f"{warehouse}/s/t-old"
    conn.execute(sa.insert(S.namespaces).values(name="s", properties="{}", created_at=T0))
    values = dict(namespace="s", name="t", location=location, external=False,
                  schema_ipc=DATA_SCHEMA.serialize().to_pybytes(), partition_by="[]", primary_key="[]",
                  properties="{}", created_at=T0, version=3, data_version=3, last_commit_at=T0 + 3)
    if version >= 5:
        values["schema_id"] = 0
    # ids come from the database, as lakestep's own inserts take them (PostgreSQL: its sequences)
    tid = conn.execute(sa.insert(S.tables).values(**values).returning(S.tables.c.table_id)).scalar_one()
    barrier = 1 if version >= 2 else None
    txn = [conn.execute(sa.insert(S.txns).values(txn_uuid=f"00000000-0000-0000-0000-00000000000{i}", job_id=job,
                                                 batch_id=batch, committed_at=T0 + i).returning(S.txns.c.txn_id))
           .scalar_one() for i, job, batch in ((1, "j", 7), (2, "j", 8), (3, None, None))]
    commit = dict(table_id=tid, removed_files=0, removed_rows=0, summary="{}")
    conn.execute(sa.insert(S.commits), [
        {**commit, "version": 0, "data_version": 0, "operation": "CREATE", "base_version": 0, "txn_id": None,
         "barrier": None, "committed_at": T0, "added_files": 0, "added_rows": 0},
        {**commit, "version": 1, "data_version": 1, "operation": "APPEND", "base_version": 0, "txn_id": txn[0],
         "barrier": None, "committed_at": T0 + 1, "added_files": 1, "added_rows": 2},
        {**commit, "version": 2, "data_version": 2, "operation": "APPEND", "base_version": 1, "txn_id": txn[1],
         "barrier": barrier, "committed_at": T0 + 2, "added_files": 1, "added_rows": 1},
        {**commit, "version": 3, "data_version": 3, "operation": "DELETE", "base_version": 2, "txn_id": txn[2],
         "barrier": None, "committed_at": T0 + 3, "added_files": 1, "added_rows": 1, "removed_files": 1,
         "removed_rows": 2}])
    conn.execute(sa.insert(S.files), [
        {**_parquet(location, "a", [1, 2], ["a", "b"]), "table_id": tid, "added_version": 1, "removed_version": 3},
        {**_parquet(location, "b", [3], ["c"]), "table_id": tid, "added_version": 2, "removed_version": None},
        {**_parquet(location, "c", [2], ["b"]), "table_id": tid, "added_version": 3, "removed_version": None}])
    if version >= 2:
        conn.execute(sa.insert(S.snapshots).values(table_id=tid, name="keep", version=2, barrier=1, created_at=T0 + 2,
                                                   expires_at=None))
        conn.execute(sa.insert(S.locks).values(locker="r", table_id=tid, version=1, kind="read",
                                               created_at=T0 + 1, expires_at=None))
        conn.execute(sa.update(S.epoch).values(open_epoch=2, opened_at=T0 + 2))
    if version >= 3:
        conn.execute(sa.insert(S.jobs).values(job_id="j", external_input=True, joined_barrier=0, created_at=T0,
                                              updated_at=T0, retired_at=None, description="old job"))
        conn.execute(sa.insert(S.job_sinks).values(job_id="j", table_id=tid))
        conn.execute(sa.update(S.topology).values(generation=2, updated_at=T0))
        conn.execute(sa.insert(S.seals).values(barrier=1, opened_at=T0 + 1, sealed_at=T0 + 2, holder="h", token=1))
        conn.execute(sa.insert(S.rollbacks).values(to_barrier=0, open_epoch=1, created_at=T0 + 0.5,
                                                   summary='{"note": "old"}'))
    if version in (4, 5):
        conn.execute(sa.insert(S.job_triggers), [  # a run at barrier 2, then (after a rollback) a run at 1
            dict(job_id="j", start_barrier=1, call_no=2, end_barrier=2, created_at=T0 + 3),
            dict(job_id="j", start_barrier=2, call_no=1, end_barrier=3, created_at=T0 + 1),
            dict(job_id="j", start_barrier=1, call_no=1, end_barrier=1, created_at=T0 + 2)])
    elif version >= 6:  # the same decisions, numbered in the order they were made
        conn.execute(sa.insert(S.trigger_decisions), [
            dict(job_id="j", start_barrier=2, call_no=1, end_barrier=3, created_at=T0 + 1),
            dict(job_id="j", start_barrier=1, call_no=1, end_barrier=1, created_at=T0 + 2),
            dict(job_id="j", start_barrier=1, call_no=2, end_barrier=2, created_at=T0 + 3)])


def _ids(tbl, **at) -> list[tuple[int, str]]:  # type: ignore[no-untyped-def]
    return sorted((r["id"], r["name"]) for r in tbl.to_arrow(**at).to_pylist())


@pytest.mark.parametrize("start", range(1, M.LATEST))
def test_upgrade_keeps_the_data_of_every_older_version(catalog_spec, start: int) -> None:  # type: ignore[no-untyped-def]
    backend = create_backend(catalog_spec.url)
    with backend.write() as conn:
        assert M.upgrade(conn, target=start) == start
        if start < 4:  # the tables of later versions do not exist yet
            assert not sa.inspect(conn).has_table("ls_job_trigger")
        _write_as_version(conn, start, catalog_spec.warehouse)
    backend.dispose()

    cat = catalog_spec.open()
    with cat.backend.read() as conn:
        assert M.current_version(conn) == M.LATEST
        decisions = [tuple(r) for r in conn.execute(sa.select(
            S.trigger_decisions.c.decision_id, S.trigger_decisions.c.job_id, S.trigger_decisions.c.start_barrier,
            S.trigger_decisions.c.call_no, S.trigger_decisions.c.end_barrier).order_by(
                S.trigger_decisions.c.decision_id))]
        assert not sa.inspect(conn).has_table("ls_job_trigger")
    # version 6 copies version 4's decisions in the order they were made (and keeps its own)
    assert decisions == ([(1, "j", 2, 1, 3), (2, "j", 1, 1, 1), (3, "j", 1, 2, 2)] if start >= 4 else [])
    assert cat.list_namespaces() == ["s"] and cat.list_tables("s") == ["s.t"]
    t = cat.load_table("s.t")
    assert t.schema == DATA_SCHEMA and (t.version, t.data_version) == (3, 3)
    assert _ids(t) == [(2, "b"), (3, "c")]
    assert _ids(t, version=1) == [(1, "a"), (2, "b")]
    assert _ids(t, version=2) == [(1, "a"), (2, "b"), (3, "c")]
    assert [(h.version, h.operation, h.job_id, h.batch_id, h.barrier, h.added_rows, h.removed_rows)
            for h in t.history()] == [
        (3, "DELETE", None, None, None, 1, 2),
        (2, "APPEND", "j", 8, 1 if start >= 2 else None, 1, 0),
        (1, "APPEND", "j", 7, None, 2, 0),
        (0, "CREATE", None, None, None, 0, 0)]
    assert sorted(f.path for f in t.files()) == ["data/b.parquet", "data/c.parquet"]
    # the idempotency keys written before the upgrade still make a replay a replay
    [rec] = cat.recorded("j", 7)
    assert (rec.table, rec.version, rec.operation, rec.replayed) == (str(t.table_id), 1, "APPEND", True)
    again = t.append({"id": [9], "name": ["z"]}, job_id="j", batch_id=8)
    assert again.replayed and again.version == 2
    if start >= 2:
        assert [(s.name, s.version) for s in t.snapshots()] == [("keep", 2)]
        assert _ids(t, snapshot="keep") == [(1, "a"), (2, "b"), (3, "c")]
        assert [lock[1:] for lock in live_locks(cat)] == [("r", t.table_id, 1, "read", None)]
    else:
        assert t.snapshots() == [] and live_locks(cat) == []
    if start >= 3:
        from lakestep.barrier import Pipeline

        p = Pipeline(cat)
        [job] = p.topology.jobs()
        assert (job.job_id, job.external_input, job.sinks, job.description) == ("j", True, ("s.t",), "old job")
        assert [(s.barrier, s.holder) for s in p.seals()] == [(1, "h")]
        assert p.open_epoch() == 2
    # and the catalog takes new commits after the old ones
    r = t.append({"id": [4], "name": ["d"]}, job_id="j", batch_id=9)
    assert (r.version, r.replayed) == (4, False)
    assert _ids(cat.load_table("s.t")) == [(2, "b"), (3, "c"), (4, "d")]
    cat.close()
