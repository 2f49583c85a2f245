"""``lakestep serve`` in-process: uvicorn on a free loopback port in a thread, over a
published pipeline of the shape of tests/iceberg (a root, a derived table kept up, one
that lags, a primary-key root, an unmanaged table)."""

from __future__ import annotations

from typing import Iterator

import pytest

from lakestep import Catalog
from lakestep.barrier import OPEN_EPOCH
from lakestep.serve import create_app
from lakestep.testing.serving import Served as _Served
from tests.iceberg.conftest import Shop, customers, orders

TOKEN = "s3cret-token-for-tests"


class Served(_Served):
    """A running server of ``catalog``'s app: its base URL, and how to stop it."""

    def __init__(self, catalog: Catalog, token: str | None = None, refresh: int = 5) -> None:
        self.catalog = catalog
        super().__init__(create_app(catalog, token=token, refresh=refresh))


def published_shop(catalog: Catalog) -> Shop:
    """Five rounds, the ``counts`` job lagging in two of them: complete cuts 2, 3 and 5,
    ``shop.totals`` tagged ahead of them."""
    shop = Shop(catalog, engines=("pyiceberg",))
    shop.orders.append(orders((1, "eu", 10), (2, "us", 20), (3, "eu", 30)), barrier=OPEN_EPOCH)
    shop.customers.upsert(customers((1, "ann", 1), (2, "bob", 1)), barrier=OPEN_EPOCH)
    import pyarrow as pa

    shop.regions.append(pa.table({"region": ["eu", "us"], "label": ["Europe", "USA"]}))
    shop.step(lagging=False, check=False)
    shop.step(check=False)
    shop.orders.append(orders((4, "us", 40), (5, "apac", 50)), barrier=OPEN_EPOCH)
    shop.step(check=False)
    shop.orders.append(orders((6, "eu", 7)), barrier=OPEN_EPOCH)
    shop.customers.upsert(customers((2, "bobby", 2), (3, "cy", 1)), barrier=OPEN_EPOCH)
    shop.step(lagging=False, check=False)
    shop.orders.append(orders((7, "us", 1)), barrier=OPEN_EPOCH)
    shop.step(lagging=False, check=False)  # counts lags two barriers behind totals now
    return shop


@pytest.fixture
def shop(catalog: Catalog) -> Iterator[Shop]:
    s = published_shop(catalog)
    yield s
    s.pub.close()


@pytest.fixture
def served(shop: Shop) -> Iterator[Served]:
    s = Served(shop.cat)
    yield s
    s.stop()


@pytest.fixture
def served_token(shop: Shop) -> Iterator[Served]:
    s = Served(shop.cat, token=TOKEN)
    yield s
    s.stop()
