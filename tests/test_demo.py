"""The shopping demo (``make demo``): its checks catch what they must, and it runs end to end.

The checks are tested on pipelines built with the barrier layer directly (no
Spark): correct aggregates pass; an aggregate that is wrong at one barrier is
reported with its table, barrier and rows. The end-to-end test runs the demo
as ``make demo`` does, in a short mode, and reads its verdict.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa
import pytest

from examples import shopping
from lakestep import Catalog
from lakestep.barrier import OPEN_EPOCH, Pipeline
from lakestep.services import Coordinator

ROOT = Path(__file__).resolve().parents[1]

Agg = Callable[[pa.Table], pa.Table]


def revenue_of(orders: pa.Table) -> pa.Table:
    g = orders.group_by("customer").aggregate([("amount_cents", "sum")])
    return pa.table({"customer": g["customer"], "revenue_cents": g["amount_cents_sum"]})


def counts_of(orders: pa.Table) -> pa.Table:
    g = orders.group_by("customer").aggregate([("amount_cents", "count")])
    return pa.table({"customer": g["customer"], "orders": g["amount_cents_count"]})


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[tuple[Catalog, Pipeline, Coordinator]]:
    cat = Catalog(warehouse=str(tmp_path / "wh"))
    cat.create_namespace("shop")
    cat.create_table(shopping.ORDERS, shopping.ORDERS_SCHEMA)
    cat.create_table(shopping.REVENUE, pa.schema([("customer", pa.string()), ("revenue_cents", pa.int64())]))
    cat.create_table(shopping.COUNTS, pa.schema([("customer", pa.string()), ("orders", pa.int64())]))
    p = Pipeline(cat)
    p.register_job("ingest", sinks=[shopping.ORDERS], external_input=True)
    p.register_job("revenue", sources=[shopping.ORDERS], sinks=[shopping.REVENUE])
    p.register_job("counts", sources=[shopping.ORDERS], sinks=[shopping.COUNTS])
    coord = Coordinator(cat, interval=60.0, lease_seconds=30.0)
    yield cat, p, coord
    coord.release()
    cat.close()


def ingest(cat: Catalog, coord: Coordinator, *orders: tuple[int, str, int]) -> None:
    """One barrier: the orders committed on the open epoch, then sealed."""
    if orders:
        cat.load_table(shopping.ORDERS).append(
            pa.table({"order_id": [o[0] for o in orders], "customer": [o[1] for o in orders],
                      "amount_cents": [o[2] for o in orders]}, schema=shopping.ORDERS_SCHEMA), barrier=OPEN_EPOCH)
    coord.seal()


def run_job(cat: Catalog, p: Pipeline, job: str, sink: str, agg: Agg,
            corrupt: Callable[[pa.Table], pa.Table] = lambda t: t) -> None:
    """Every batch the derived job can run now: ``agg`` of shop.orders, as the Spark jobs write it."""
    while (plan := p.next_batch(job)) is not None:
        orders = cat.load_table(shopping.ORDERS).to_arrow(version=plan.sources[shopping.ORDERS].to_version)
        with p.batch(plan) as b:
            b.overwrite(sink, corrupt(agg(orders)))


def truth_averages(cat: Catalog, p: Pipeline, barrier: int) -> dict[str, Fraction]:
    return shopping.Truth(cat, p).averages(barrier)


def test_every_barrier_check_passes_consistent_aggregates(shop: tuple[Catalog, Pipeline, Coordinator]) -> None:
    cat, p, coord = shop
    ingest(cat, coord)  # barrier 1: no orders
    ingest(cat, coord, (0, "ann", 1999), (1, "bob", 5))
    run_job(cat, p, "revenue", shopping.REVENUE, revenue_of)  # revenue ahead ...
    ingest(cat, coord, (2, "ann", 1))
    ingest(cat, coord)  # barrier 4: no orders
    run_job(cat, p, "revenue", shopping.REVENUE, revenue_of)
    run_job(cat, p, "counts", shopping.COUNTS, counts_of)  # ... counts catches up in one go
    assert [p.frontier(t) for t in shopping.AGGREGATES] == [4, 4]
    assert shopping.check_every_barrier(cat, 4) == []
    from lakestep.iceberg import Publisher

    pub = Publisher(cat)
    pub.publish_once()
    pub.close()
    assert shopping.check_iceberg_tags(cat) == (8, [])  # barriers 1..4 of both aggregates, through PyIceberg
    b, rows = shopping.read_iceberg(cat)
    assert b == 4 and shopping.averages(rows) == truth_averages(cat, p, 4)
    truth = shopping.Truth(cat, p)
    assert truth.at(1) == {} and truth.at(3) == {"ann": (2000, 2), "bob": (5, 1)}
    assert truth.averages(3)["ann"] == 1000  # exact: a Fraction


def test_every_barrier_check_reports_table_barrier_and_rows(shop: tuple[Catalog, Pipeline, Coordinator]) -> None:
    cat, p, coord = shop
    ingest(cat, coord, (0, "ann", 100), (1, "bob", 250))
    run_job(cat, p, "revenue", shopping.REVENUE, revenue_of)
    run_job(cat, p, "counts", shopping.COUNTS, counts_of)

    def one_cent_off(t: pa.Table) -> pa.Table:  # off by one cent for bob: no float could tell
        values = [v + (c == "bob") for c, v in zip(t["customer"].to_pylist(), t["revenue_cents"].to_pylist())]
        return t.set_column(1, "revenue_cents", pa.array(values, pa.int64()))

    ingest(cat, coord, (2, "bob", 1), (3, "cy", 7))
    run_job(cat, p, "revenue", shopping.REVENUE, revenue_of, corrupt=one_cent_off)  # barrier 2: wrong
    ingest(cat, coord, (4, "ann", 1))
    run_job(cat, p, "revenue", shopping.REVENUE, lambda o: revenue_of(o).filter(pa.array(
        [c != "cy" for c in revenue_of(o)["customer"].to_pylist()])))  # barrier 3: a customer missing
    run_job(cat, p, "counts", shopping.COUNTS, counts_of)  # correct throughout

    found = shopping.check_every_barrier(cat, 3)
    assert [(m.table, m.barrier) for m in found] == [(shopping.REVENUE, 2), (shopping.REVENUE, 3)]
    from lakestep.iceberg import Publisher

    pub = Publisher(cat)
    pub.publish_once()
    pub.close()
    tagged, problems = shopping.check_iceberg_tags(cat)
    assert tagged == 6 and len(problems) == 2 and all("shop.revenue read through Iceberg" in m for m in problems)
    assert "tag barrier-2" in problems[0] and "('bob', 252)" in problems[0]
    assert found[0].rows == [("bob", [252], [251])]
    assert found[1].rows == [("cy", [], [7])]
    report = found[0].report()
    assert "shop.revenue at barrier 2" in report and re.search(r"bob\s+252\s+251", report)
    assert re.search(r"cy\s+\(no row\)\s+7", found[1].report())


def test_orders_check_finds_missing_and_duplicated_orders(shop: tuple[Catalog, Pipeline, Coordinator]) -> None:
    cat, _, coord = shop
    ingest(cat, coord, (0, "ann", 100), (1, "bob", 250), (1, "bob", 250))
    assert shopping.check_orders(cat, {0: ("ann", 100), 1: ("bob", 250)}) == [
        "1 extra or duplicated rows in shop.orders: [(1, 'bob', 250)]"]
    assert shopping.check_orders(cat, {0: ("ann", 100), 1: ("bob", 250), 2: ("cy", 1)})[0] == (
        "1 orders sent but missing from shop.orders: [(2, 'cy', 1)]")


def test_averages_are_exact() -> None:
    """52.62125 and 55.34875 dollars: the rounding ties that once flipped with float sums."""
    avg = shopping.averages([("ann", 42097, 8), ("bob", 44279, 8), ("cy", 10525, 2), ("dee", 10527, 2)])
    assert avg == {"ann": Fraction(42097, 8), "bob": Fraction(44279, 8), "cy": Fraction(10525, 2),
                   "dee": Fraction(10527, 2)}
    assert [shopping.dollars(avg[c]) for c in ("ann", "bob", "cy", "dee")] == ["  52.62", "  55.35", "  52.62",
                                                                                "  52.64"]  # half to even


@pytest.mark.spark
def test_shopping_demo_end_to_end(tmp_path: Path) -> None:
    """``make demo`` in a short mode: it exits 0, proves every barrier, and keeps Spark quiet."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "examples.shopping", "--seconds", "4"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env=env)
    out = proc.stdout
    assert proc.returncode == 0, f"the demo failed:\n{out[-5000:]}\n{proc.stderr[-5000:]}"
    checked = re.search(r"^checked (\d+) barriers: all consistent$", out, flags=re.M)
    assert checked and int(checked.group(1)) >= 2, out[-3000:]
    assert "each exactly once" in out and "starting Spark (local mode)..." in out and "Spark ready" in out
    assert re.search(r"^\d+ dashboard reads: .* read_committed differed from the truth at its barrier 0 time",
                     out, flags=re.M), out[-3000:]
    tags = re.search(r"^checked (\d+) Iceberg tags of shop.revenue, shop.counts through PyIceberg: all consistent$",
                     out, flags=re.M)
    assert tags and int(tags.group(1)) >= 4, out[-3000:]  # the outside reader: every tag of both aggregates
    assert re.search(r"^\d+ reads through Iceberg \(PyIceberg, newest common tag\): 0 differed", out, flags=re.M)
    for noise in ("WARN", "log4j", "Setting default log level", "Your hostname", "WARNING"):
        assert noise not in out + proc.stderr, f"Spark noise on the console ({noise!r}):\n{proc.stderr[-3000:]}"
