"""Fixtures shared by the whole suite.

Every catalog behaviour runs on SQLite and on PostgreSQL: ``catalog_spec`` is
parametrized over both. PostgreSQL tests get a fresh schema (``search_path``)
in a database of the test session's own (``lst_lane_<time>_<pid>``), made in the server named by
``LAKESTEP_TEST_PG_URL`` (default: the local server on 127.0.0.1:5432, database ``test``) when the
session starts and dropped, with every schema in it, when it ends: one ``DROP DATABASE`` instead of
a ``DROP SCHEMA ... CASCADE`` per test (0.1 s each, ~700 tests a lane). ``make test`` makes sure
the server is running.

Tests marked ``s3`` run on a second kind of storage as well: ``catalog_spec``
gains ``sqlite-s3`` and ``postgres-s3``, whose warehouse is a fresh bucket of
a real S3-protocol server (moto's, in its own process on 127.0.0.1:
``tests/s3server.py``), reached with ``storage_options``. Only the suites the
storage matters to carry the mark (the conflict matrix and cleanup, on S3
with PostgreSQL): S3 costs time. The Druid scenarios carry it with
``opt_in=True``: on S3 only when ``LAKESTEP_TEST_S3=all`` (CI does not set
it). The streaming crash test chooses its own pairs (SQLite on the local
disk, PostgreSQL on S3); tests/catalog/test_object_store.py and
tests/streaming/test_object_store_spark.py run on S3 only.

``spark_cluster`` is a real Spark standalone cluster (tests/sparkcluster.py: a
master and two workers from the pyspark distribution), for
tests/streaming/test_cluster.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator
from urllib.parse import quote

import pytest
import sqlalchemy as sa

from lakestep import Catalog
from lakestep.clock import ManualClock

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from lakestep.testing.pgcluster import PgCluster
    from lakestep.testing.pgproxy import PgProxy
    from tests.catalog.workers import Worker
    from tests.s3server import S3Server
    from tests.sparkcluster import SparkCluster

PG_URL = os.environ.get("LAKESTEP_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


@dataclass(frozen=True)
class CatalogSpec:
    """How to open one test catalog: from this process or from a worker process."""

    backend: str
    url: str
    warehouse: str
    storage: tuple[tuple[str, str], ...] = ()  # storage_options (an S3 warehouse)

    @property
    def on_s3(self) -> bool:
        return self.warehouse.startswith("s3://")

    @property
    def storage_options(self) -> dict[str, str]:
        return dict(self.storage)

    def open(self, **kwargs: object) -> Catalog:
        return Catalog(self.url, warehouse=self.warehouse,  # type: ignore[arg-type]
                       storage_options=self.storage_options, **kwargs)

    def filesystem(self) -> "pafs.FileSystem":
        """The warehouse's storage as pyarrow sees it, made here (not through lakestep): for checks."""
        import pyarrow.fs as pafs

        if not self.on_s3:
            return pafs.LocalFileSystem()
        o = self.storage_options
        return pafs.S3FileSystem(endpoint_override=o["endpoint_override"], access_key=o["access_key"],
                                 secret_key=o["secret_key"], region=o["region"])

    @staticmethod
    def fs_path(location: str) -> str:
        """``location`` as a path of :meth:`filesystem`."""
        return location.split("://", 1)[1] if "://" in location else location

    def files_under(self, location: str) -> dict[str, int]:
        """Every file under ``location`` (one recursive listing): path relative to it -> size."""
        import pyarrow.fs as pafs

        root = self.fs_path(location).rstrip("/")
        infos = self.filesystem().get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        return {i.path[len(root) + 1:]: i.size for i in infos if i.type == pafs.FileType.File}

    def mtime(self, location: str, rel: str) -> float:
        """The modification time storage reports for ``rel`` under ``location`` (S3: whole seconds)."""
        info = self.filesystem().get_file_info(f"{self.fs_path(location).rstrip('/')}/{rel}")
        return info.mtime.timestamp()

    def put(self, location: str, rel: str, data: bytes) -> None:
        with self.filesystem().open_output_stream(f"{self.fs_path(location).rstrip('/')}/{rel}") as out:
            out.write(data)


_LANE_DB_PREFIX = "lst_lane_"
_STALE_LANE_DB_S = 6 * 3600  # a lane database this old is a killed run's: dropped by the next session


def _psycopg2(url: sa.URL) -> sa.URL:
    return url.set(drivername="postgresql+psycopg2") if url.drivername == "postgresql" else url


def _pg_engine(url: sa.URL) -> sa.Engine:
    return sa.create_engine(_psycopg2(url), isolation_level="AUTOCOMMIT", pool_size=2)


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[sa.Engine]:
    """An AUTOCOMMIT engine on the session's own database (the module docstring), which holds every
    PostgreSQL test catalog's schema and is dropped when the session ends."""
    import time

    root = _pg_engine(sa.make_url(PG_URL))
    name = f"{_LANE_DB_PREFIX}{int(time.time())}_{os.getpid()}"
    try:
        with root.connect() as c:
            stale = c.execute(sa.text("SELECT datname FROM pg_database WHERE datname LIKE :p"),
                              {"p": f"{_LANE_DB_PREFIX}%"}).scalars().all()
            for old in stale:  # killed sessions' leftovers, never a running session's
                made = old[len(_LANE_DB_PREFIX):].split("_")[0]
                if made.isdigit() and time.time() - int(made) > _STALE_LANE_DB_S:
                    c.execute(sa.text(f'DROP DATABASE IF EXISTS "{old}" WITH (FORCE)'))
            c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as e:  # pragma: no cover - environment problem
        pytest.fail(f"PostgreSQL is not reachable at {PG_URL} (run `make test`, which starts it): {e}")
    engine = _pg_engine(sa.make_url(PG_URL).set(database=name))
    try:
        yield engine
    finally:
        engine.dispose()
        root.dispose()
        _drop_database_later(name)


def _drop_database_later(name: str) -> None:
    """Drop the session's database (the catalogs' schemas with it; connections left open are ended) in a
    process of its own that the session does not wait for: with a lane's ~800 catalog schemas the server
    takes 6-18 s to remove them, which would be the lane's last seconds. If that process is killed first,
    the next session drops the database (``_STALE_LANE_DB_S``)."""
    script = ("import sqlalchemy as sa, sys\n"
              "e = sa.create_engine(sys.argv[1], isolation_level='AUTOCOMMIT')\n"
              "with e.connect() as c:\n"
              "    c.execute(sa.text('DROP DATABASE IF EXISTS \"' + sys.argv[2] + '\" WITH (FORCE)'))\n")
    url = _psycopg2(sa.make_url(PG_URL))
    subprocess.Popen([sys.executable, "-c", script, url.render_as_string(hide_password=False), name],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)


def _pg_schema_url(admin: sa.Engine, schema: str) -> str:
    """LAKESTEP_TEST_PG_URL on ``admin``'s database (the session's), with ``schema`` first on the search path."""
    url = sa.make_url(PG_URL).set(database=admin.url.database).render_as_string(hide_password=False)
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


@contextlib.contextmanager
def _pg_spec(admin: sa.Engine, warehouse: str) -> Iterator[CatalogSpec]:
    """A fresh schema in the session's database (left there: the database goes when the session ends)."""
    schema = f"lst_{uuid.uuid4().hex[:12]}"
    with admin.connect() as c:
        c.execute(sa.text(f"CREATE SCHEMA {schema}"))
    yield CatalogSpec("postgres", _pg_schema_url(admin, schema), warehouse)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``catalog_spec``: SQLite and PostgreSQL; with the ``s3`` mark, each with an S3 warehouse too."""
    if "catalog_spec" not in metafunc.fixturenames:
        return
    if any("catalog_spec" in str(m.args[0]) for m in metafunc.definition.iter_markers("parametrize")):
        return  # the test chose its catalogs itself
    kinds = ["sqlite", "postgres"]
    s3 = metafunc.definition.get_closest_marker("s3")
    # @pytest.mark.s3 (both backends) or @pytest.mark.s3("postgres"); with opt_in=True only when
    # LAKESTEP_TEST_S3=all (suites too long for CI on both storages)
    if s3 is not None and (not s3.kwargs.get("opt_in") or os.environ.get("LAKESTEP_TEST_S3") == "all"):
        kinds += [f"{b}-s3" for b in (s3.args or ("sqlite", "postgres"))]
    metafunc.parametrize("catalog_spec", kinds, indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that starts Spark must be marked ``spark``: `make test` (scripts/test.py) runs the
    Spark tests one after the other in a lane of their own, beside the other tests."""
    spark_fixtures = {"spark", "kafka_spark", "every_trigger", "spark_cluster"}
    unmarked = [i.nodeid for i in items
                if spark_fixtures & set(getattr(i, "fixturenames", ())) and i.get_closest_marker("spark") is None]
    if unmarked:
        raise pytest.UsageError(f"tests that use Spark without the 'spark' mark: {unmarked[:5]}")
    # the JVM peers' tests last: in a fresh clone their virtualenv and jars are made beside the lanes as the
    # run starts (scripts/test.py's prep, ~2 min), which the first of them would otherwise wait for
    items.sort(key=lambda i: i.nodeid.startswith("tests/interop/"))


@pytest.fixture
def catalog_spec(request: pytest.FixtureRequest, tmp_path) -> Iterator[CatalogSpec]:  # type: ignore[no-untyped-def]
    """A fresh catalog location, on SQLite and on PostgreSQL (and, marked ``s3``, with an S3 warehouse)."""
    backend, _, store = request.param.partition("-")
    warehouse, storage = str(tmp_path / "warehouse"), ()
    if store == "s3":
        server = request.getfixturevalue("s3_server")
        warehouse, storage = f"s3://{server.new_bucket()}/warehouse", tuple(sorted(server.options().items()))
    if backend == "sqlite":
        db = tmp_path / "catalog.db" if storage else f"{warehouse}/catalog.db"
        yield CatalogSpec("sqlite", f"sqlite:///{db}", warehouse, storage)
        return
    with _pg_spec(request.getfixturevalue("pg_admin"), warehouse) as spec:
        yield dataclasses.replace(spec, storage=storage)


@pytest.fixture(scope="session")
def s3_server() -> Iterator["S3Server"]:
    """A real S3-protocol server (moto's, its own process) on a free port of 127.0.0.1."""
    from tests.s3server import S3Server

    server = S3Server()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def _spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator["SparkCluster"]:
    from tests.sparkcluster import SparkCluster

    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def spark_cluster(_spark_cluster: "SparkCluster") -> "SparkCluster":
    """A Spark standalone cluster (tests/sparkcluster.py: a master and two workers, separate JVMs on
    127.0.0.1), started once per test module and stopped after it; each test gets both workers running
    and no task held."""
    _spark_cluster.disarm()
    _spark_cluster.ensure_workers()
    return _spark_cluster


@pytest.fixture
def pg_spec(pg_admin: sa.Engine, tmp_path) -> Iterator[CatalogSpec]:  # type: ignore[no-untyped-def]
    """For the few behaviours that exist only with a database server (a dropped connection)."""
    with _pg_spec(pg_admin, str(tmp_path / "warehouse")) as spec:
        yield spec


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator["PgCluster"]:
    """A PostgreSQL server of the suite's own (lakestep/testing/pgcluster.py: initdb into a temporary
    directory, a free port), for tests that stop and start the database."""
    from lakestep.testing.pgcluster import PgCluster

    with PgCluster() as cluster:
        yield cluster


@pytest.fixture
def own_pg(pg_cluster: "PgCluster", tmp_path) -> Iterator[CatalogSpec]:  # type: ignore[no-untyped-def]
    """A catalog in a fresh database of ``pg_cluster``, which the test may stop and start
    (it is running when the test starts and when it ends)."""
    if not pg_cluster.running:
        pg_cluster.start()
    yield CatalogSpec("postgres", pg_cluster.create_database(), str(tmp_path / "warehouse"))
    if not pg_cluster.running:
        pg_cluster.start()


@pytest.fixture
def pg_proxied(pg_spec: CatalogSpec) -> Iterator[tuple[CatalogSpec, "PgProxy"]]:
    """The PostgreSQL catalog of ``pg_spec`` reached through a fault-injecting TCP proxy (lakestep/testing/pgproxy.py)."""
    from lakestep.testing.pgproxy import pg_proxy

    with pg_proxy(pg_spec.url) as proxy:
        yield CatalogSpec("postgres", proxy.url_for(pg_spec.url), pg_spec.warehouse), proxy


class SharedCatalogs:
    """One catalog per kind of ``catalog_spec`` (backend, and local disk or S3) for a whole test
    module, made on first use and dropped when the module ends: for scenario matrices whose every
    case works on a table of its own (a fresh name in the shared catalog), so that each case does
    not pay for making the catalog's database schema (about 0.5 s on PostgreSQL under load)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory, stack: contextlib.ExitStack) -> None:
        self._tmp, self._stack = tmp_path_factory, stack
        self._made: dict[tuple[str, bool], tuple[CatalogSpec, Catalog]] = {}

    def like(self, spec: CatalogSpec, request: pytest.FixtureRequest) -> tuple[CatalogSpec, Catalog]:
        key = (spec.backend, spec.on_s3)
        if key not in self._made:
            warehouse = str(self._tmp.mktemp("shared-catalog") / "warehouse")
            if spec.on_s3:
                warehouse = f"s3://{request.getfixturevalue('s3_server').new_bucket()}/warehouse"
            if spec.backend == "sqlite":
                db = (self._tmp.mktemp("shared-db") / "catalog.db") if spec.on_s3 else f"{warehouse}/catalog.db"
                shared = CatalogSpec("sqlite", f"sqlite:///{db}", warehouse, spec.storage)
            else:
                made = self._stack.enter_context(_pg_spec(request.getfixturevalue("pg_admin"), warehouse))
                shared = dataclasses.replace(made, storage=spec.storage)
            cat = shared.open()
            self._stack.callback(cat.close)
            self._made[key] = (shared, cat)
        return self._made[key]


@pytest.fixture(scope="module")
def shared_catalogs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedCatalogs]:
    with contextlib.ExitStack() as stack:
        yield SharedCatalogs(tmp_path_factory, stack)


@pytest.fixture
def shared_catalog(catalog_spec: CatalogSpec, shared_catalogs: SharedCatalogs,
                   request: pytest.FixtureRequest) -> tuple[CatalogSpec, Catalog]:
    """The module's catalog of the kind of ``catalog_spec`` (SharedCatalogs): the test must work on
    tables of its own only."""
    return shared_catalogs.like(catalog_spec, request)


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


# --- durations: what scripts/test.py summarises and tests/test_budget.py guards -----------------
_DURATIONS = os.environ.get("LAKESTEP_TEST_DURATIONS")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ``LAKESTEP_TEST_DURATIONS=FILE`` (set by scripts/test.py for each lane), append each
    phase's duration as pytest itself measured it (the figure ``--durations`` prints) to FILE, one
    JSON object a line: ``{"nodeid", "when", "duration", "outcome"}``."""
    if _DURATIONS:
        import json

        row = {"nodeid": report.nodeid, "when": report.when, "duration": round(report.duration, 3),
               "outcome": report.outcome}
        if report.when == "teardown":  # the CPU the lane's processes spent since the last test ended
            global _CPU_SEEN, _SELF_SEEN
            now, self_now = _tree_cpu(), sum(os.times()[:2])
            row["cpu"], _CPU_SEEN = round(now - _CPU_SEEN, 2), now
            row["cpu_pytest"], _SELF_SEEN = round(self_now - _SELF_SEEN, 2), self_now  # this process's own
        with open(_DURATIONS, "a") as out:
            out.write(json.dumps(row) + "\n")


_CPU_SEEN = _SELF_SEEN = 0.0


def _tree_cpu() -> float:
    """CPU seconds (user + system) this process and its descendants spent so far: its own and its
    reaped children's, plus every live descendant's (and theirs). A process that outlived its parent
    (reparented to init) is no longer counted; good enough to say where a lane's CPU goes."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / tick)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0.0))[1]
        todo.extend(children.get(pid, ()))
    return total
