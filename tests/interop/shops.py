"""What every JVM engine's test in tests/interop reads: the published shop of tests/serve (a root, a
primary-key root, a derived table kept up and one that lags) on SQLite and on PostgreSQL, served by
`lakestep serve`, and lakestep's own answers to compare the engine's with."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from lakestep import Catalog
from lakestep.barrier import OPEN_EPOCH, Pipeline
from lakestep.iceberg import status
from tests.conftest import CatalogSpec, _pg_spec
from tests.iceberg.conftest import orders
from tests.serve.conftest import Served, published_shop

JOIN = ("SELECT t.region, t.total, c.total, c.n FROM {a} t JOIN {b} c ON t.region = c.region "
        "ORDER BY t.region")
"""The join of the derived table kept up and the lagging one; ``a`` and ``b`` name them."""


@dataclass
class ServedShop:
    spec: CatalogSpec
    cat: Catalog
    served: Served
    barriers: list[int]  # the complete cuts: tagged on every managed table
    complete: int  # the newest of them (``main``)

    @property
    def backend(self) -> str:
        return self.spec.backend


def tagged(shop: Any, ident: str) -> set[int]:
    refs = shop.engines.table(ident).metadata.refs
    return {int(r.split("-", 1)[1]) for r in refs if r.startswith("barrier-")}


def at(cat: Catalog, ident: str, barrier: int) -> pa.Table:
    return cat.load_table(ident).to_arrow(version=Pipeline(cat).version_at(ident, barrier))


def joined(cat: Catalog, barrier: int) -> list[list[Any]]:
    """lakestep's own answer to JOIN at ``barrier``."""
    t = {r["region"]: r for r in at(cat, "shop.totals", barrier).to_pylist()}
    c = {r["region"]: r for r in at(cat, "shop.counts", barrier).to_pylist()}
    return [[k, t[k]["total"], c[k]["total"], c[k]["n"]] for k in sorted(t.keys() & c.keys())]


def customers(s: ServedShop) -> list[list[Any]]:
    """lakestep's primary-key table at the complete cut (upserted rows: old ones deleted by position)."""
    return sorted([r["cid"], r["name"], r["tier"]] for r in at(s.cat, "shop.customers", s.complete).to_pylist())


def orders_rows(s: ServedShop) -> list[list[Any]]:
    """lakestep's root at the complete cut, its decimal and date as strings."""
    return sorted([r["id"], r["region"], r["amount"], str(r["price"]), str(r["day"])]
                  for r in at(s.cat, "shop.orders", s.complete).to_pylist())


def served_shops(stack: contextlib.ExitStack, work: Path, pg_admin: sa.Engine) -> list[ServedShop]:
    """Both backends' shops, published and served until ``stack`` closes. Each lags: the derived
    table kept up is barriers ahead of the lagging one, which no tag shows (a tag is a complete cut)."""
    specs = [CatalogSpec("sqlite", f"sqlite:///{work}/sqlite-wh/catalog.db", str(work / "sqlite-wh")),
             stack.enter_context(_pg_spec(pg_admin, str(work / "pg-wh")))]
    out = []
    for spec in specs:
        cat = spec.open()
        stack.callback(cat.close)
        shop = published_shop(cat)
        shop.step(check=False)  # counts catches up: the complete cut holds the customers' upserts (deletes)
        shop.orders.append(orders((8, "apac", 5)), barrier=OPEN_EPOCH)
        shop.step(lagging=False, check=False)  # and lags again
        stack.callback(shop.pub.close)
        served = Served(cat)
        stack.callback(served.stop)
        common = set.intersection(*(tagged(shop, i) for i in ("shop.orders", "shop.customers",
                                                               "shop.totals", "shop.counts")))
        complete = status(cat).complete
        assert complete is not None and complete == max(common)
        ahead, behind = shop.p.frontier("shop.totals"), shop.p.frontier("shop.counts")
        assert ahead is not None and behind is not None and ahead > behind >= complete, (ahead, behind, complete)
        out.append(ServedShop(spec, cat, served, sorted(common), complete))
    return out


def check(engine: str, answers: dict[str, Any], want: dict[str, Any], contains: str) -> int:
    """Every answer whose name holds ``contains`` equals lakestep's; how many there were."""
    names = [n for n in want if contains in n]
    assert names
    for name in names:
        got = answers[name]
        assert not isinstance(got, dict), f"{name}: {got['error']}"
        assert got == want[name], f"{name}: {engine} read {got}, lakestep {want[name]}"
    return len(names)
