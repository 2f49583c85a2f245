"""Metadata database backends: what differs between SQLite and PostgreSQL.

The differences are capabilities of a :class:`Backend`, not ``if`` branches
spread through the commit code:

* how a *write transaction* starts and serializes writers:
  SQLite takes a process-wide ``flock`` on a sidecar file (waiters wake at once
  when it is released, unlike SQLite's sleeping busy handler) and then
  ``BEGIN IMMEDIATE``; PostgreSQL starts a normal transaction and the commit
  code locks the rows of the tables it changes with ``SELECT ... FOR UPDATE``;
* whether rows can be locked (``row_locks``);
* how to take a catalog-wide lock for schema upgrades.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from .. import _failpoints
from ..errors import CatalogError, CatalogUnavailableError

log = logging.getLogger(__name__)


@dataclass
class Backend:
    engine: Engine
    name: str
    row_locks: bool

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        """A connection inside a write transaction; commits on a clean exit."""
        with self.engine.begin() as conn:
            yield conn

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            yield conn

    def catalog_lock(self, conn: Connection) -> None:
        """Serialize schema upgrades between processes (inside ``write()``)."""

    def commit_blind(self, change: Any, txn: dict[str, Any]) -> Any:
        """Commit one blind append or upsert on the fast path (appends.py)."""
        raise NotImplementedError

    def dispose(self) -> None:
        self.engine.dispose()


class SQLiteBackend(Backend):
    def __init__(self, engine: Engine, path: str) -> None:
        super().__init__(engine=engine, name="sqlite", row_locks=False)
        self.lock_path = path + ".lock"

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with self.engine.connect() as conn:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.exec_driver_sql("ROLLBACK")
                    raise
                conn.exec_driver_sql("COMMIT")
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def commit_blind(self, change: Any, txn: dict[str, Any]) -> Any:
        from . import appends

        with self.write() as conn:
            _failpoints.hit("commit.locked")
            result = appends.sqlite_commit(conn, change, txn)
            _failpoints.hit("commit.before_db_commit")
            return result

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        # One deferred transaction so that several statements see one snapshot.
        with self.engine.connect() as conn:
            conn.exec_driver_sql("BEGIN")
            try:
                yield conn
            finally:
                conn.exec_driver_sql("ROLLBACK")


class PostgresBackend(Backend):
    def __init__(self, engine: Engine) -> None:
        super().__init__(engine=engine, name="postgresql", row_locks=True)

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        # REPEATABLE READ: several statements of one read see one snapshot.
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield conn

    def catalog_lock(self, conn: Connection) -> None:
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(7362842190)"))

    def commit_blind(self, change: Any, txn: dict[str, Any]) -> Any:
        from . import appends

        _failpoints.hit("commit.locked")
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            return appends.postgres_commit(conn, change, txn)


def _sqlite_path(url: sa.URL) -> str:
    db = url.database
    if not db or db == ":memory:":
        raise CatalogError("lakestep needs a SQLite *file* (several processes share it), not :memory:")
    return os.path.abspath(db)


def create_backend(url: str, *, echo: bool = False, pool_size: int = 5) -> Backend:
    """Open the metadata database at ``url`` (any SQLAlchemy URL of a supported kind)."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as e:
        raise CatalogError(f"not a database URL: {url!r}") from e
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        path = _sqlite_path(parsed)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        engine = sa.create_engine(
            parsed.set(database=path),
            echo=echo,
            connect_args={"isolation_level": None, "timeout": 60.0, "check_same_thread": False},
        )

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.close()

        return SQLiteBackend(engine, path)
    if backend == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg2")
        engine = sa.create_engine(
            parsed,
            echo=echo,
            pool_size=pool_size,
            max_overflow=10,
            pool_recycle=3600,
            connect_args={"connect_timeout": 10, "application_name": "lakestep"},
        )
        return PostgresBackend(engine)
    raise CatalogError(
        f"unsupported catalog database {backend!r}: lakestep supports sqlite and postgresql"
    )


def is_transient(exc: BaseException) -> bool:
    """A database error after which reconnecting and retrying may succeed."""
    if isinstance(exc, sa.exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        if isinstance(exc, sa.exc.OperationalError):
            return True  # lost connection, server shutting down, database is locked
        orig = exc.orig
        code = getattr(orig, "pgcode", None)
        # serialization_failure, deadlock_detected
        return code in ("40001", "40P01")
    return False


def unavailable(exc: BaseException, *, outcome_unknown: bool = False) -> CatalogUnavailableError:
    return CatalogUnavailableError(
        f"the catalog database is unavailable: {exc}", outcome_unknown=outcome_unknown
    )
