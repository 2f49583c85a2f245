"""Cleanup keeps what any retained version, snapshot or lock needs; TTL; metadata pruning.

On the local disk and on S3 (``s3`` mark, tests/conftest.py; S3 with PostgreSQL
only, as the conflict matrix): what storage holds is checked with a filesystem
made by the test, not lakestep's."""

from __future__ import annotations

import datetime as dt
import os
import time

import pyarrow as pa
import pytest

from lakestep import Catalog, errors
from lakestep.catalog.cleanup import IN_FLIGHT_FLOOR_SECONDS
from lakestep.catalog.ttl import apply_ttl
from lakestep.clock import ManualClock

pytestmark = pytest.mark.s3("postgres")

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.date32())])


def stored_bytes(spec, location: str) -> int:  # type: ignore[no-untyped-def]
    return sum(spec.files_under(location).values())


@pytest.fixture
def table(clocked: Catalog):  # type: ignore[no-untyped-def]
    clocked.create_namespace("s")
    return clocked.create_table("s.t", SCHEMA, properties={"lakestep.retention-seconds": "60"})


def test_cleanup_keeps_window_snapshots_and_locks(catalog_spec, table, clock: ManualClock) -> None:  # type: ignore[no-untyped-def]
    d = dt.date(2026, 1, 1)
    for i in range(4):
        table.append({"id": [i], "day": [d]})
    table.create_snapshot("two", version=2)
    pin = table.lock(locker="slow-reader", version=3, lease_seconds=None)
    table.compact()
    table.delete([("id", "=", 0)])
    # inside the window nothing goes, whatever the dry run says
    report = table.cleanup(dry_run=True)
    assert report.deleted_files == [] and report.dry_run
    clock.advance(59.5)  # the last commits are 59.5 s old: still inside the 60 s window
    assert table.cleanup(dry_run=True).deleted_files == []
    clock.advance(1)
    dry = table.cleanup(dry_run=True)
    assert dry.deleted_files and dry.deleted_bytes > 0
    assert table.to_arrow(version=1).num_rows == 1  # a dry run deletes nothing
    real = table.cleanup()
    assert real.deleted_files == dry.deleted_files and real.deleted_bytes == dry.deleted_bytes
    # the snapshot and the pinned version still read in full; the newest too
    assert sorted(table.to_arrow(snapshot="two").column("id").to_pylist()) == [0, 1]
    assert sorted(table.to_arrow(version=3).column("id").to_pylist()) == [0, 1, 2]
    assert sorted(table.to_arrow().column("id").to_pylist()) == [1, 2, 3]
    with pytest.raises(errors.VersionNotFoundError):  # expired, and pruned from the history
        table.to_arrow(version=1)
    assert 1 not in [h.version for h in table.history()]
    with pytest.raises(errors.VersionNotFoundError):  # no new pin on an expired version
        table.lock(locker="late", version=1)
    head = table.version
    with pytest.raises(errors.VersionNotFoundError, match="cleaned up"):  # nor a restore of what is left of it
        table.restore(1)
    assert table.version == head and sorted(table.to_arrow().column("id").to_pylist()) == [1, 2, 3]
    # released: everything but the live data can go
    pin.release()
    table.drop_snapshot("two")
    table.cleanup()
    assert stored_bytes(catalog_spec, table.location) == sum(f.file_size for f in table.files())


def test_orphans_are_removed_after_the_window_and_the_floor(catalog_spec, table, clock: ManualClock) -> None:  # type: ignore[no-untyped-def]
    table.append({"id": [1], "day": [dt.date(2026, 1, 1)]})
    rel = "data/never-committed.parquet"
    catalog_spec.put(table.location, rel, b"x" * 10)
    if catalog_spec.on_s3:  # the store sets the time (its clock, whole seconds): lakestep allows a
        written = catalog_spec.mtime(table.location, rel) + 1.0  # second of slack (cleanup.py)
        clock.set(written)
    else:
        written = clock.now()
        os.utime(os.path.join(table.location, rel), (written, written))  # written now, by the catalog's clock
    assert table.cleanup().orphan_files == []  # too young: may belong to a writer about to commit
    clock.set(written + 61)  # older than the 60 s window, but a commit may still be in flight
    assert table.cleanup().orphan_files == [] and rel in catalog_spec.files_under(table.location)
    clock.set(written + IN_FLIGHT_FLOOR_SECONDS - 0.5)
    assert table.cleanup().orphan_files == []
    clock.set(written + IN_FLIGHT_FLOOR_SECONDS)  # exactly as old as the floor
    report = table.cleanup(dry_run=True)
    assert report.orphan_files == [rel] and report.orphan_bytes == 10
    assert rel in catalog_spec.files_under(table.location)  # a dry run deletes nothing
    table.cleanup()
    assert rel not in catalog_spec.files_under(table.location)
    assert table.to_arrow().num_rows == 1


def test_cleanup_never_takes_the_files_of_a_commit_in_flight(catalog_spec, catalog, worker_pair) -> None:  # type: ignore[no-untyped-def]
    """Retention 0: a writer process has written its file and not committed yet when cleanup
    runs. Before the floor, cleanup deleted the file as an orphan, the commit then landed and
    the table could not be read any more (issue 9, item 3)."""
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", SCHEMA, properties={"lakestep.retention-seconds": "0"})
    t.append({"id": [1], "day": [dt.date(2026, 1, 1)]})
    writer, _ = worker_pair
    writer.prepare(catalog_spec, "append", "s.t", pa.table({"id": [2], "day": [dt.date(2026, 1, 2)]}, schema=SCHEMA))
    in_flight = stored_files(catalog_spec, t) - {f.path for f in t.files()}
    assert len(in_flight) == 1  # written, not committed: an orphan to anyone who looks
    report = t.cleanup()
    assert report.orphan_files == []
    assert writer.commit()[0]["version"] == 2
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2]
    assert stored_files(catalog_spec, t) == {f.path for f in t.files()}


def stored_files(spec, t) -> set[str]:  # type: ignore[no-untyped-def]
    """The files under the table's ``data/`` as storage lists them (relative to the table)."""
    return {p for p in spec.files_under(t.location) if p.startswith("data/")}


N_RACE = 60


def append_loop(cat: Catalog, n: int) -> list[int]:
    """Worker: n appends of one row each (ids 0..n-1); the versions committed."""
    t = cat.load_table("s.t")
    return [t.append({"id": [i], "day": [dt.date(2026, 1, 1)]}).version for i in range(n)]


def cleanup_loop(cat: Catalog, n: int) -> int:
    """Worker: n cleanups of s.t with its retention (0); the orphans it deleted."""
    t = cat.load_table("s.t")
    return sum(len(t.cleanup().orphan_files) for _ in range(n))


def test_cleanup_beside_a_writer_with_retention_0_loses_nothing(catalog_spec, catalog) -> None:  # type: ignore[no-untyped-def]
    """Two processes, a fixed number of operations each: one appends, the other cleans up
    with retention 0. Nothing the writer committed goes missing."""
    from .workers import Worker

    catalog.create_namespace("s")
    t = catalog.create_table("s.t", SCHEMA, properties={"lakestep.retention-seconds": "0"})
    workers = [Worker(), Worker()]
    try:
        for w in workers:  # spawned and connected before either starts
            w.call(catalog_spec, "tests.catalog.workers", "ping")
        workers[0].send_call(catalog_spec, __name__, "append_loop", N_RACE)
        workers[1].send_call(catalog_spec, __name__, "cleanup_loop", 4 * N_RACE)
        versions = workers[0].receive(timeout=300)
        deleted = workers[1].receive(timeout=300)
    finally:
        for w in workers:
            w.stop()
    assert versions == list(range(1, N_RACE + 1)) and deleted == 0
    assert sorted(t.to_arrow().column("id").to_pylist()) == list(range(N_RACE))  # every file still there
    assert stored_files(catalog_spec, t) == {f.path for f in t.files()}


def test_ttl_by_partition_and_by_rows(catalog: Catalog) -> None:
    catalog.create_namespace("s")
    today = dt.datetime.now(dt.timezone.utc).date()
    old = today - dt.timedelta(days=40)
    by_part = catalog.create_table(
        "s.p", SCHEMA, partition_by=["day"],
        properties={"lakestep.ttl.column": "day", "lakestep.ttl.seconds": str(30 * 86400)})
    by_part.append({"id": [1, 2], "day": [old, today]})
    r = apply_ttl(by_part)
    assert r.operation == "OVERWRITE" and r.removed_files == 1 and r.added_files == 0  # metadata only
    assert by_part.to_arrow().column("id").to_pylist() == [2]
    ts_schema = pa.schema([("id", pa.int64()), ("at", pa.timestamp("us", tz="UTC"))])
    by_row = catalog.create_table(
        "s.r", ts_schema, properties={"lakestep.ttl.column": "at", "lakestep.ttl.seconds": "3600"})
    now = dt.datetime.now(dt.timezone.utc)
    by_row.append({"id": [1, 2], "at": [now - dt.timedelta(hours=2), now]})
    apply_ttl(by_row)
    assert by_row.to_arrow().column("id").to_pylist() == [2]
    assert apply_ttl(catalog.create_table("s.none", SCHEMA)) is None


def test_metadata_is_pruned(table, clock: ManualClock) -> None:  # type: ignore[no-untyped-def]
    import sqlalchemy as sa

    from lakestep.catalog import schema as S

    for i in range(30):
        table.append({"id": [i], "day": [dt.date(2026, 1, 1)]}, job_id="j", batch_id=i)
        if i % 10 == 9:
            table.compact()
    clock.advance(61)
    table.cleanup()
    with table.catalog.backend.read() as conn:
        n_commits = conn.execute(sa.select(sa.func.count()).select_from(S.commits).where(
            S.commits.c.table_id == table.table_id)).scalar()
        n_files = conn.execute(sa.select(sa.func.count()).select_from(S.files).where(
            S.files.c.table_id == table.table_id)).scalar()
        n_txn = conn.execute(sa.select(sa.func.count()).select_from(S.txns)).scalar()
    # the one commit left is the last compaction (its transaction stays), and job j's newest
    # key (batch 29) is kept for as long as the catalog lives (exactly once has no window)
    assert n_commits == 1 and n_files == len(table.files()) == 1 and n_txn == 2
    assert sorted(table.to_arrow().column("id").to_pylist()) == list(range(30))


def test_a_shorter_window_than_the_tables_needs_force(clocked, clock) -> None:  # type: ignore[no-untyped-def]
    catalog = clocked
    catalog.create_namespace("w")
    t = catalog.create_table("w.t", pa.schema([("id", pa.int64())]), properties={"lakestep.retention-seconds": "60"})
    t.append({"id": [1]})
    t.overwrite({"id": [2]})
    with pytest.raises(errors.InvalidArgumentError, match="shorter than"):
        t.cleanup(retention_seconds=0)
    assert t.to_arrow(version=1).column("id").to_pylist() == [1]  # nothing went
    t.cleanup(retention_seconds=120)  # longer is always fine
    clock.advance(1)
    assert len(t.cleanup(retention_seconds=0, force=True).deleted_files) == 1


def test_exactly_once_outlives_the_retention_window(catalog) -> None:  # type: ignore[no-untyped-def]
    """A job down longer than the retention window replays its last batches after cleanup
    has run: they are recognised as replays (the job's newest key is kept forever), and
    the rows come out exactly once. A new batch id still commits."""
    import sqlalchemy as sa

    from lakestep.catalog import schema as S
    from lakestep.catalog.cleanup import cleanup

    catalog.create_namespace("x")
    t = catalog.create_table("x.t", pa.schema([("id", pa.int64())]), properties={"lakestep.retention-seconds": "60"})
    other = catalog.create_table("x.o", pa.schema([("id", pa.int64())]))
    t.append({"id": [1]}, job_id="ingest", batch_id=0)
    t.append({"id": [2]}, job_id="ingest", batch_id=1)
    other.append({"id": [7]}, job_id="side", batch_id=5)
    t.append({"id": [3]})  # no key
    cleanup(t, now=time.time() + 3600)  # the window has long passed: every older record may go
    with catalog.backend.read() as conn:
        keys = sorted(tuple(r) for r in conn.execute(sa.select(S.txns.c.job_id, S.txns.c.batch_id)).all()
                      if r[0] is not None)
    assert keys == [("ingest", 1), ("side", 5)]  # each job's newest key, exactly

    for batch in (1, 0):  # Spark replays the last batch; an older one is a replay as well
        for _ in range(2):  # twice: the general path's check and the fast path's
            r = t.append({"id": [2 if batch else 1]}, job_id="ingest", batch_id=batch)
            assert r.replayed and r.added_rows == 0
            assert r.summary == {"replay_of_pruned_batch": True, "newest_batch": 1}  # ingest's, not side's 5
        with catalog.transaction(job_id="ingest", batch_id=batch) as tx:
            tx.overwrite(t, {"id": [99]})
        assert all(r.replayed for r in tx.results)
        assert [r.summary for r in tx.results] == [{"replay_of_pruned_batch": True, "newest_batch": 1}]
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2, 3]
    assert not t.append({"id": [4]}, job_id="ingest", batch_id=2).replayed
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2, 3, 4]
    assert other.append({"id": [7]}, job_id="side", batch_id=5).replayed
