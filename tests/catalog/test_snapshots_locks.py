"""Named snapshots, version locks, and the open-epoch stamp on commits."""

from __future__ import annotations

import pyarrow as pa
import pytest

from lakestep import Catalog, errors
from lakestep.catalog import OPEN_EPOCH, LockNotFoundError, SnapshotExistsError
from lakestep.clock import ManualClock

SCHEMA = pa.schema([("id", pa.int64())])


@pytest.fixture
def table(clocked: Catalog):  # type: ignore[no-untyped-def]
    clocked.create_namespace("s")
    return clocked.create_table("s.t", SCHEMA)


def test_snapshots(table, clock: ManualClock) -> None:  # type: ignore[no-untyped-def]
    table.append({"id": [1]})
    s1 = table.create_snapshot("first", barrier=7)
    table.append({"id": [2]})
    short = table.create_snapshot("short", retain_seconds=60)
    assert (short.created_at, short.expires_at) == (clock.now(), clock.now() + 60)
    assert (s1.version, s1.barrier) == (1, 7)
    with pytest.raises(SnapshotExistsError):
        table.create_snapshot("first")
    assert table.create_snapshot("first", exist_ok=True).version == 1
    assert table.to_arrow(snapshot="first").column("id").to_pylist() == [1]
    assert [s.name for s in table.snapshots()] == ["first", "short"]
    clock.advance(59.5)
    assert [s.name for s in table.snapshots()] == ["first", "short"]
    assert table.to_arrow(snapshot="short").column("id").to_pylist() == [1, 2]
    clock.advance(0.5)
    assert [s.name for s in table.snapshots()] == ["first"]  # retention by age: gone at its expiry
    with pytest.raises(errors.VersionNotFoundError):
        table.to_arrow(snapshot="short")
    table.create_snapshot("v2")
    assert table.expire_snapshots(keep_last=1) == 2  # "first" and the expired "short"
    assert [s.name for s in table.snapshots()] == ["v2"]
    table.drop_snapshot("v2")
    assert table.snapshots() == []
    with pytest.raises(errors.VersionNotFoundError):
        table.create_snapshot("future", version=99)


def test_version_locks(clocked: Catalog, table, clock: ManualClock) -> None:  # type: ignore[no-untyped-def]
    from lakestep.catalog.lifecycle import live_locks, release_locks

    catalog = clocked
    table.append({"id": [1]})
    with table.lock(locker="reader-1") as pin:
        assert pin.version == 1
        assert [(l[1], l[3]) for l in live_locks(catalog, table.table_id)] == [("reader-1", 1)]
    assert live_locks(catalog, table.table_id) == []
    leased = table.lock(locker="reader-2", lease_seconds=30)
    permanent = table.lock(locker="reader-3", lease_seconds=None)
    assert leased.expires_at == clock.now() + 30 and permanent.expires_at is None
    clock.advance(20)
    leased.renew(30)  # a live reader renews: 30 s from now
    clock.advance(29.5)
    assert [l[1] for l in live_locks(catalog)] == ["reader-2", "reader-3"]
    clock.advance(0.5)
    assert [l[1] for l in live_locks(catalog)] == ["reader-3"]  # the crashed reader's lease lapsed
    with pytest.raises(LockNotFoundError):
        leased.renew(10)
    permanent.renew(10)
    assert release_locks(catalog, "reader-3") == 1
    assert live_locks(catalog) == []


def test_open_epoch_is_stamped_in_the_commit(table) -> None:  # type: ignore[no-untyped-def]
    r = table.append({"id": [1]}, barrier=OPEN_EPOCH)
    assert r.barrier == 1
    assert table.history(limit=1)[0].barrier == 1
    assert table.append({"id": [2]}, barrier=5).barrier == 5
    assert table.append({"id": [3]}).barrier is None
