"""Every published tag, read by PyIceberg, DuckDB and Polars, equals lakestep's rows at its barrier."""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pytest

from lakestep.barrier import OPEN_EPOCH
from lakestep.iceberg import tag_name
from tests.iceberg.conftest import Shop, customers, orders
from tests.iceberg.readers import assert_same


# SQLite on the local disk, PostgreSQL on S3: each backend's SQL and each storage once (the plain
# PostgreSQL run added nothing the S3 one does not do, and took 26 s)
@pytest.mark.parametrize("catalog_spec", ["sqlite", "postgres-s3"], indirect=True)
def test_every_kind_of_change(shop: Shop) -> None:
    cat = shop.cat
    # appends to the root; the lagging job waits one round, so the first cut waits for it
    shop.orders.append(orders((1, "eu", 10), (2, "us", 20), (3, "eu", 30)), barrier=OPEN_EPOCH)
    shop.customers.upsert(customers((1, "ann", 1), (2, "bob", 1)), barrier=OPEN_EPOCH)
    shop.regions.append(pa.table({"region": ["eu", "us"], "label": ["Europe", "USA"]}))
    r = shop.step(lagging=False)
    assert r.barriers == [] and r.complete is None  # counts has not precommitted barrier 1 yet
    r = shop.step()
    assert r.barriers == [1, 2] and r.complete == 2
    assert sorted(r.tables["shop.orders"].tags) == [1, 2]
    shop.orders.append(orders((4, "us", 40), (5, "apac", 50)), barrier=OPEN_EPOCH)
    shop.step()
    # a compaction: same rows, a REPLACE snapshot
    assert shop.orders.compact(min_files=2).removed_files >= 2
    r = shop.step()
    snap = shop.engines.table("shop.orders").snapshot_by_name(tag_name(r.barriers[-1]))
    assert snap.summary.operation.value == "replace", snap.summary
    # copy-on-write delete and update (overwrite snapshots that remove the old files)
    with cat.transaction() as tx:
        tx.delete("shop.orders", [("id", "=", 2)], barrier=OPEN_EPOCH)
    shop.step()
    with cat.transaction() as tx:
        tx.update("shop.orders", {"amount": 41}, [("id", "=", 4)], barrier=OPEN_EPOCH)
    shop.step()
    # overwrites: a partition of the root, and the whole unmanaged table
    with cat.transaction() as tx:
        tx.overwrite("shop.orders", orders((6, "us", 60)), partitions=[{"region": "us"}], barrier=OPEN_EPOCH)
    shop.regions.overwrite(pa.table({"region": ["eu"], "label": ["EU"]}))
    shop.step()
    # a schema change: a column added, written by the next batches
    shop.orders.add_columns(pa.field("coupon", pa.string()))
    shop.orders.append(pa.table({**{c: orders((7, "eu", 70)).column(c) for c in orders().column_names},
                                 "coupon": ["SPRING"]}), barrier=OPEN_EPOCH)
    r = shop.step()
    t = shop.engines.table("shop.orders")
    assert [(f.name, f.field_id) for f in t.schema().fields] == [
        ("id", 1), ("region", 2), ("amount", 3), ("price", 4), ("day", 5), ("coupon", 6)]  # ids kept, a new one
    assert [f.name for f in t.schemas()[t.snapshot_by_name(tag_name(1)).schema_id].fields] == \
        ["id", "region", "amount", "price", "day"]  # an old tag keeps the schema it was published with
    # upserts and deletes of a primary-key table, a multi-table transaction, a major compaction
    with cat.transaction() as tx:
        tx.upsert("shop.customers", customers((2, "bobby", 2), (3, "cy", 1)), barrier=OPEN_EPOCH)
        tx.append("shop.orders", pa.table({**{c: orders((8, "apac", 80)).column(c) for c in orders().column_names},
                                            "coupon": [None]}), barrier=OPEN_EPOCH)
    shop.step()
    with cat.transaction() as tx:
        tx.delete("shop.customers", [("cid", "=", 1)], barrier=OPEN_EPOCH)
    shop.customers.upsert(customers((3, "cyd", 3), (4, "dee", 1)), barrier=OPEN_EPOCH)
    shop.step()
    assert shop.customers.compact(major=True).removed_files >= 2
    shop.step()
    latest = shop.engines.table("shop.customers")
    assert sorted(r["cid"] for r in latest.scan().to_arrow().to_pylist()) == [2, 3, 4]
    # a rollback: the tags above its target are removed, and made again with the new rows
    before = {b for b in shop.engines.table("shop.totals").metadata.refs if b.startswith("barrier-")}
    target = shop.pub_complete() - 2
    shop.p.rollback(to=target)
    r = shop.step()
    assert sorted(r.tables["shop.totals"].removed_tags) == [target + 1, target + 2]
    shop.checked = {(i, b) for i, b in shop.checked if int(b.split("-")[1]) <= target}
    after = {b for b in shop.engines.table("shop.totals").metadata.refs if b.startswith("barrier-")}
    assert {tag_name(target + 1), tag_name(target + 2)} & before and not (after - before - {
        tag_name(b) for b in r.barriers})
    shop.orders.append(orders((9, "eu", 90)), barrier=OPEN_EPOCH)
    shop.step()
    assert shop.check(every_tag=True) > 0


def test_cleanup_past_retention_keeps_what_tags_name(catalog_spec, clock) -> None:  # type: ignore[no-untyped-def]
    """Tags expire with lakestep's version retention (no coordinator snapshots here); cleanup
    deletes the files of expired tags only, and every remaining tag reads the same."""
    cat = catalog_spec.open(clock=clock)
    shop = Shop(cat, engines=("pyiceberg", "duckdb"))
    try:
        for t in (shop.orders, shop.totals, shop.counts, shop.customers):
            t.set_properties({"lakestep.retention-seconds": "100"})
        for i in range(4):
            shop.orders.append(orders((10 * i + 1, "eu", i), (10 * i + 2, "us", i)), barrier=OPEN_EPOCH)
            shop.customers.upsert(customers((1, f"v{i}", i)), barrier=OPEN_EPOCH)
            shop.step()
            clock.advance(60)
        shop.orders.compact(min_files=2)
        shop.customers.compact(major=True)
        shop.step()
        before = shop.engines.table("shop.orders").metadata.refs
        # far enough that every file on storage is older than cleanup's orphan floor (an hour)
        clock.set(max(clock.now(), time.time()) + 86_400)
        shop.orders.append(orders((99, "eu", 9)), barrier=OPEN_EPOCH)
        r = shop.step()
        assert r.tables["shop.orders"].removed_tags, "tags past the retention window expire"
        kept = shop.engines.table("shop.orders").metadata.refs
        assert set(kept) < set(before) | {tag_name(b) for b in r.barriers}
        for t in (shop.orders, shop.customers):
            rep = t.cleanup()
            assert rep.deleted_files, "the compacted files left the window and no tag names them"
            assert not [f for f in rep.deleted_files + rep.orphan_files if not f.startswith("data/")]
        shop.check(every_tag=True)  # every tag still there reads the same, in every engine
    finally:
        shop.pub.close()
        cat.close()


def test_main_of_an_unmanaged_table_is_its_newest_version(catalog) -> None:  # type: ignore[no-untyped-def]
    shop = Shop(catalog, engines=("pyiceberg",))
    try:
        shop.regions.append(pa.table({"region": ["eu"], "label": ["Europe"]}))
        shop.pub.publish_once()
        assert_same(shop.engines, "shop.regions", "main", shop.regions.to_arrow())
        shop.regions.append(pa.table({"region": ["us"], "label": ["USA"]}))
        shop.pub.publish_once()
        assert_same(shop.engines, "shop.regions", "main", shop.regions.to_arrow())
        assert not [r for r in shop.engines.table("shop.regions").metadata.refs if r.startswith("barrier-")]
    finally:
        shop.pub.close()



def test_tags_are_capped_oldest_first(catalog) -> None:  # type: ignore[no-untyped-def]
    shop = Shop(catalog, engines=("pyiceberg",))
    shop.pub.max_tags = 3
    try:
        for i in range(6):
            shop.orders.append(orders((i, "eu", i)), barrier=OPEN_EPOCH)
            shop.step(check=False)
        tags = sorted(int(n.split("-")[1]) for n in shop.engines.table("shop.orders").metadata.refs
                      if n.startswith("barrier-"))
        assert tags == [4, 5, 6]
        shop.check(every_tag=True)
    finally:
        shop.pub.close()


def test_unpublishable_renamed_dropped_and_opted_out_tables(catalog) -> None:  # type: ignore[no-untyped-def]
    """A table Iceberg cannot represent is left out with its reason (the others go on and the cut
    advances); a table opted out is not published; a renamed table keeps its Iceberg table under
    the new name; a dropped table's Iceberg table and metadata files go."""
    from pyiceberg.exceptions import NoSuchTableError

    from lakestep.iceberg import status

    shop = Shop(catalog, engines=("pyiceberg",))
    try:
        catalog.create_table("shop.nanos", pa.schema([("t", pa.timestamp("ns"))]))
        catalog.create_table("shop.private", pa.schema([("x", pa.int64())]),
                             properties={"lakestep.iceberg.publish": "false"})
        gone = catalog.create_table("shop.gone", pa.schema([("x", pa.int64())]))
        gone.append(pa.table({"x": [1]}))
        shop.orders.append(orders((1, "eu", 1)), barrier=OPEN_EPOCH)
        r = shop.step(errors=True)
        assert "IcebergSchemaError" in r.tables["shop.nanos"].error and "nanosecond" in r.tables["shop.nanos"].error
        assert r.complete == 1 and "shop.private" not in r.tables
        assert "nanosecond" in status(catalog).tables["shop.nanos"]["error"]
        with pytest.raises(NoSuchTableError):
            shop.engines.table("shop.private")
        location = shop.engines.table("shop.gone").metadata_location
        catalog.rename_table("shop.regions", "shop.places")
        catalog.drop_table("shop.gone")
        shop.pub.publish_once()
        assert shop.engines.table("shop.places").scan().to_arrow().num_rows == 0
        for name in ("shop.regions", "shop.gone"):
            with pytest.raises(NoSuchTableError):
                shop.engines.table(name)
        assert not os.path.exists(location.removeprefix("file://"))
    finally:
        shop.pub.close()


def test_tags_follow_the_coordinators_barrier_retention(catalog) -> None:  # type: ignore[no-untyped-def]
    """With coordinator snapshots (the default), a tag lives as long as its barrier is retained."""
    from lakestep.barrier import sealing

    shop = Shop(catalog, engines=("pyiceberg",))
    policy = sealing.SnapshotPolicy(every=1, retain_count=3)
    shop.seal = lambda: sealing.seal_and_snapshot(  # type: ignore[method-assign]
        catalog, shop.lease, 1e9, topology=shop.p.topology, policy=policy)[0].barrier
    try:
        for i in range(7):
            shop.orders.append(orders((i, "eu", i)), barrier=OPEN_EPOCH)
            shop.step(check=False)
        oldest = shop.p.status().oldest_retained
        assert oldest is not None and oldest > 1
        for ident in ("shop.orders", "shop.totals", "shop.counts"):
            tags = sorted(int(n.split("-")[1]) for n in shop.engines.table(ident).metadata.refs
                          if n.startswith("barrier-"))
            assert tags == list(range(oldest, shop.p.committed_barrier() + 1)), (ident, oldest, tags)
        shop.check(every_tag=True)
    finally:
        shop.pub.close()


def test_another_iceberg_catalog_database(catalog, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``iceberg_url``: the Iceberg SQL catalog in a database of its own; lakestep's stays free of it."""
    import sqlalchemy as sa

    from lakestep.iceberg import Publisher, sql_catalog

    other = f"sqlite:///{tmp_path / 'iceberg.db'}"
    catalog.create_namespace("shop")
    t = catalog.create_table("shop.dim", pa.schema([("k", pa.int64())]))
    t.append(pa.table({"k": [1, 2]}))
    pub = Publisher(catalog, iceberg_url=other)
    try:
        assert not pub.publish_once().errors
        got = sql_catalog(catalog, iceberg_url=other).load_table("shop.dim").scan().to_arrow()
        assert sorted(got["k"].to_pylist()) == [1, 2]
        with catalog.backend.read() as conn:
            assert not sa.inspect(conn).has_table("iceberg_tables")
    finally:
        pub.close()


def test_cleanup_keeps_the_files_of_retained_tags(catalog_spec, clock) -> None:  # type: ignore[no-untyped-def]
    """The coordinator snapshots every other barrier; a tag between two of them names a version
    that neither a lakestep snapshot nor the retention window keeps: only the publisher's pin
    keeps its files from cleanup, and the tag still reads the same afterwards."""
    import sqlalchemy as sa

    from lakestep.barrier import sealing
    from lakestep.catalog import schema as S
    from lakestep.catalog.pins import pinned_storage

    cat = catalog_spec.open(clock=clock)
    shop = Shop(cat, engines=("pyiceberg", "duckdb"))
    policy = sealing.SnapshotPolicy(every=2, retain_count=50)
    shop.seal = lambda: sealing.seal_and_snapshot(  # type: ignore[method-assign]
        cat, shop.lease, 1e9, topology=shop.p.topology, policy=policy)[0].barrier
    try:
        shop.orders.set_properties({"lakestep.retention-seconds": "10"})
        for i in range(6):
            shop.orders.append(orders((i, "eu", i), (100 + i, "us", i)), barrier=OPEN_EPOCH)
            shop.step(check=False)
            shop.orders.compact(min_files=2)  # each barrier's files are removed by the next version
        clock.set(max(clock.now(), time.time()) + 86_400)
        shop.orders.append(orders((99, "eu", 9)), barrier=OPEN_EPOCH)
        shop.step(check=False)
        with cat.backend.read() as conn:
            snapshotted = set(conn.execute(sa.select(S.snapshots.c.version).where(
                S.snapshots.c.table_id == shop.orders.table_id)).scalars())
            published = set(conn.execute(sa.select(S.published_snapshots.c.version).where(
                S.published_snapshots.c.table_id == shop.orders.table_id)).scalars())
        only_pinned = published - snapshotted
        assert only_pinned, "some tagged version is kept by the publisher's pin alone"
        pins = S.published_snapshots
        with cat.backend.write() as conn:  # without the pins, cleanup would take those files
            saved = [dict(r) for r in conn.execute(pins.select()).mappings()]
            conn.execute(sa.delete(pins))
        assert shop.orders.cleanup(dry_run=True).deleted_files
        with cat.backend.write() as conn:
            conn.execute(sa.insert(pins), saved)
        # the operator's view names the same pins cleanup keeps: the publisher's among them
        held = pinned_storage(shop.orders)
        assert {p.version for p in held.pins} == set(shop.orders.cleanup(dry_run=True).pinned_versions)
        assert {p.version for p in held.pins if p.kind == "iceberg"} == published
        assert any(p.files for p in held.pins if p.kind == "iceberg" and p.version in only_pinned)
        rep = shop.orders.cleanup()
        assert set(rep.pinned_versions) >= only_pinned and not rep.deleted_files
        shop.check(every_tag=True)  # every tag, the ones between snapshots too, reads the same
    finally:
        shop.pub.close()
        cat.close()
