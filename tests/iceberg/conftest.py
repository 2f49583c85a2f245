"""A pipeline of the shape of examples/ (a root, a derived table kept up, a derived table that
lags, an unmanaged table, a primary-key root table), driven step by step: the test seals,
derives and publishes, so every barrier is known exactly."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lakestep import Catalog
from lakestep.barrier import Pipeline, sealing
from lakestep.iceberg import Publisher, PublishReport, tag_name
from tests.iceberg.readers import Engines, assert_same, lakestep_rows

ORDERS = pa.schema([("id", pa.int64()), ("region", pa.string()), ("amount", pa.int64()),
                    ("price", pa.decimal128(10, 2)), ("day", pa.date32())])
CUSTOMERS = pa.schema([("cid", pa.int64()), ("name", pa.string()), ("tier", pa.int32())])
TOTALS = pa.schema([("region", pa.string()), ("total", pa.int64()), ("n", pa.int64())])
REGIONS = pa.schema([("region", pa.string()), ("label", pa.string())])
TABLES = ("shop.orders", "shop.customers", "shop.totals", "shop.counts", "shop.regions")


def orders(*rows: tuple[int, str, int]) -> pa.Table:
    return pa.table({"id": [r[0] for r in rows], "region": [r[1] for r in rows], "amount": [r[2] for r in rows],
                     "price": [decimal.Decimal(r[2]) / 4 for r in rows],
                     "day": [dt.date(2026, 1, 1 + r[0] % 28) for r in rows]}, schema=ORDERS)


def customers(*rows: tuple[int, str, int]) -> pa.Table:
    return pa.table({"cid": [r[0] for r in rows], "name": [r[1] for r in rows], "tier": [r[2] for r in rows]},
                    schema=CUSTOMERS)


class Shop:
    """The pipeline, the publisher and the engines that read what it publishes."""

    def __init__(self, catalog: Catalog, engines: tuple[str, ...] = ("pyiceberg", "duckdb", "polars")) -> None:
        self.cat = catalog
        catalog.create_namespace("shop", exist_ok=True)
        self.orders = catalog.create_table("shop.orders", ORDERS, partition_by=["region"])
        self.customers = catalog.create_table("shop.customers", CUSTOMERS, primary_key=["cid"])
        self.totals = catalog.create_table("shop.totals", TOTALS)
        self.counts = catalog.create_table("shop.counts", TOTALS)
        self.regions = catalog.create_table("shop.regions", REGIONS)
        self.p = Pipeline(catalog)
        self.p.register_job("ingest", sinks=["shop.orders", "shop.customers"], external_input=True)
        self.p.register_job("totals", sources=["shop.orders"], sinks=["shop.totals"])
        self.p.register_job("counts", sources=["shop.orders"], sinks=["shop.counts"])
        self.lease = sealing.acquire(catalog, "tests", 1e9)
        self.pub = Publisher(catalog)
        self.engines = Engines(catalog, engines)
        self.checked: set[tuple[str, str]] = set()

    def seal(self) -> int:
        s = sealing.seal(self.cat, self.lease, 1e9)
        assert s is not None
        return s.barrier

    def _derive(self, job: str, sink: str) -> None:
        while (plan := self.p.next_batch(job)) is not None:
            rows = self.orders.to_arrow(version=plan.sources["shop.orders"].to_version)
            agg = rows.group_by("region").aggregate([("amount", "sum"), ("id", "count")])
            out = pa.table({"region": agg["region"], "total": pc.cast(agg["amount_sum"], pa.int64()),
                            "n": pc.cast(agg["id_count"], pa.int64())}, schema=TOTALS)
            with self.p.batch(plan) as b:
                b.overwrite(sink, out)

    def derive(self, *, lagging: bool = True) -> None:
        self._derive("totals", "shop.totals")
        if lagging:
            self._derive("counts", "shop.counts")

    def step(self, *, lagging: bool = True, check: bool = True, errors: bool = False) -> PublishReport:
        """Seal, run the derived jobs, publish; then check every new tag and every main."""
        self.seal()
        self.derive(lagging=lagging)
        r = self.pub.publish_once()
        assert errors or not r.errors, r.errors
        if check:
            self.check()
        return r

    def check(self, *, every_tag: bool = False) -> int:
        """Every tag not checked yet (all of them with ``every_tag``) read by every engine equals
        lakestep's rows at its barrier; ``main`` equals the tag of the complete cut. Returns
        the number of reads compared."""
        n = 0
        complete = self.pub_complete()
        for ident in TABLES:
            t = self.engines.table(ident)
            tags = sorted(int(r.split("-", 1)[1]) for r in t.metadata.refs if r.startswith("barrier-"))
            for b in tags:
                if not every_tag and (ident, tag_name(b)) in self.checked:
                    continue
                expected = lakestep_rows(self.cat, ident, self.version_at(t, ident, b))
                assert_same(self.engines, ident, tag_name(b), expected, t)
                self.checked.add((ident, tag_name(b)))
                n += 1
            if ident == "shop.regions":  # unmanaged: main is its newest version
                assert_same(self.engines, ident, "main", self.regions.to_arrow(), t)
            elif complete is not None and tags:
                assert t.metadata.current_snapshot_id == t.snapshot_by_name(tag_name(complete)).snapshot_id, \
                    (ident, complete)
        return n

    def version_at(self, t: object, ident: str, b: int) -> int:
        """lakestep's version of ``ident`` at barrier ``b``. Once cleanup pruned the commits the
        barrier lookup needs, the tag (kept while its version is) is compared with the version
        its summary names."""
        from lakestep.barrier import BarrierNotRetainedError

        snap = t.snapshot_by_name(tag_name(b))  # type: ignore[attr-defined]
        named = int(snap.summary.additional_properties["lakestep.version"])
        assert int(snap.summary.additional_properties["lakestep.barrier"]) <= b
        try:
            v = self.p.version_at(ident, b)
        except BarrierNotRetainedError:
            return named
        return v  # may be newer than ``named`` with the same rows: a compaction since (design.md §3.4)

    def pub_complete(self) -> int | None:
        from lakestep.iceberg import status

        return status(self.cat).complete


@pytest.fixture
def shop(catalog: Catalog) -> Iterator[Shop]:
    s = Shop(catalog)
    yield s
    s.pub.close()
