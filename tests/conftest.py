"""Fixtures shared by the whole suite.

Every catalog behaviour runs on SQLite and on PostgreSQL: ``catalog_spec`` is
parametrized over both. PostgreSQL tests get a fresh schema (``search_path``)
in the server named by ``LAKESTEP_TEST_PG_URL`` (default: the local server on
127.0.0.1:5432, database ``test``); ``make test`` makes sure one is running.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator
from urllib.parse import quote

import pytest
import sqlalchemy as sa

from lakestep import Catalog
from lakestep.clock import ManualClock

if TYPE_CHECKING:
    from tests.catalog.workers import Worker
    from tests.pgproxy import PgProxy

PG_URL = os.environ.get("LAKESTEP_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


@dataclass(frozen=True)
class CatalogSpec:
    """How to open one test catalog: from this process or from a worker process."""

    backend: str
    url: str
    warehouse: str

    def open(self, **kwargs: object) -> Catalog:
        return Catalog(self.url, warehouse=self.warehouse, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[sa.Engine]:
    url = sa.make_url(PG_URL)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg2")
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", pool_size=2)
    try:
        with engine.connect() as c:
            c.execute(sa.text("select 1"))
    except sa.exc.OperationalError as e:  # pragma: no cover - environment problem
        pytest.fail(f"PostgreSQL is not reachable at {PG_URL} (run `make test`, which starts it): {e}")
    yield engine
    engine.dispose()


def _pg_schema_url(schema: str) -> str:
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options={quote(f'-csearch_path={schema}')}"


@contextlib.contextmanager
def _pg_spec(admin: sa.Engine, warehouse: str) -> Iterator[CatalogSpec]:
    schema = f"lst_{uuid.uuid4().hex[:12]}"
    with admin.connect() as c:
        c.execute(sa.text(f"CREATE SCHEMA {schema}"))
    try:
        yield CatalogSpec("postgres", _pg_schema_url(schema), warehouse)
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))


@pytest.fixture(params=["sqlite", "postgres"])
def catalog_spec(request: pytest.FixtureRequest, tmp_path) -> Iterator[CatalogSpec]:  # type: ignore[no-untyped-def]
    """A fresh catalog location, once on SQLite and once on PostgreSQL."""
    warehouse = str(tmp_path / "warehouse")
    if request.param == "sqlite":
        yield CatalogSpec("sqlite", f"sqlite:///{warehouse}/catalog.db", warehouse)
        return
    with _pg_spec(request.getfixturevalue("pg_admin"), warehouse) as spec:
        yield spec


@pytest.fixture
def pg_spec(pg_admin: sa.Engine, tmp_path) -> Iterator[CatalogSpec]:  # type: ignore[no-untyped-def]
    """For the few behaviours that exist only with a database server (a dropped connection)."""
    with _pg_spec(pg_admin, str(tmp_path / "warehouse")) as spec:
        yield spec


@pytest.fixture
def pg_proxied(pg_spec: CatalogSpec) -> Iterator[tuple[CatalogSpec, "PgProxy"]]:
    """The PostgreSQL catalog of ``pg_spec`` reached through a fault-injecting TCP proxy (tests/pgproxy.py)."""
    from tests.pgproxy import pg_proxy

    with pg_proxy(pg_spec.url) as proxy:
        yield CatalogSpec("postgres", proxy.url_for(pg_spec.url), pg_spec.warehouse), proxy


@pytest.fixture
def catalog(catalog_spec: CatalogSpec) -> Iterator[Catalog]:
    cat = catalog_spec.open()
    yield cat
    cat.close()


@pytest.fixture
def clock() -> ManualClock:
    """A clock that moves only when the test moves it (lakestep/clock.py)."""
    return ManualClock()


@pytest.fixture
def clocked(catalog_spec: CatalogSpec, clock: ManualClock) -> Iterator[Catalog]:
    """The catalog of ``catalog_spec`` (SQLite and PostgreSQL) on ``clock``: ages, leases and
    expiry are decided by moving the clock, never by sleeping."""
    cat = catalog_spec.open(clock=clock)
    yield cat
    cat.close()


@pytest.fixture(scope="session")
def worker_pair() -> Iterator[tuple["Worker", "Worker"]]:
    """Two long-lived worker processes (spawned once per test run)."""
    from tests.catalog.workers import Worker

    pair = (Worker(), Worker())
    yield pair
    for w in pair:
        w.stop()
