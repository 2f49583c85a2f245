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

* the blind append (appends.py): one implementation per backend, behind
  :meth:`Backend.append` (inside a write transaction) and
  :meth:`Backend.commit_blind` (the one-table fast path).

**One seam for database errors.** Every statement lakestep sends runs inside
:meth:`Backend.read`, :meth:`Backend.write` or :meth:`Backend.commit_blind`,
and those turn the driver's and the pool's errors into lakestep's:

* a lost or refused connection, a server that stops answering, a pool with no
  free connection, a locked SQLite file: :class:`CatalogUnavailableError`
  (the commit loop in ``catalog.py`` retries those, then looks its
  transaction up by uuid);
* a file that is not a SQLite database, or a damaged one:
  :class:`CatalogCorruptError`;
* any other refusal by the database: :class:`CatalogError` with the
  database's one-line message (never the SQL text or its parameters);
* unique-key violations (``IntegrityError``) pass through unchanged: the
  callers that expect one (idempotency keys, trigger decisions) catch it.

**PostgreSQL connections never change state.** Connections are in autocommit
mode for their whole life; transactions are explicit (``BEGIN`` ...
``COMMIT``; reads ``BEGIN ISOLATION LEVEL REPEATABLE READ`` ... ``ROLLBACK``)
and the blind-append fast path is one autocommit statement. Nothing has to be
reset when a connection goes back to the pool, so a connection that died
right after its commit landed is simply discarded: it cannot raise from the
pool's check-in (where the error used to escape raw and leak the pool slot).

**PostgreSQL timeouts** (:class:`DatabaseTimeouts`, settable per catalog):
``connect_timeout``; TCP keepalives (a dead peer is noticed on idle
connections); a server-side ``statement_timeout``; and a client-side
watchdog: a statement with no answer ``statement_timeout + grace`` seconds
after it was sent (a server or proxy that stopped answering) has its socket
shut down, so the call fails with :class:`CatalogUnavailableError` instead of
hanging. Optionally ``idle_in_transaction_session_timeout``: the server ends
a session that sat inside a transaction that long without sending anything
(a client process paused or stalled mid-transaction), which releases the
row locks it held; the coordinator sets it to its lease. Not guaranteed: on
SQLite nothing ends a paused writer's transaction; its write lock is held
until the process resumes or dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import itertools
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from .. import _failpoints
from ..errors import CatalogCorruptError, CatalogError, CatalogUnavailableError, InvalidArgumentError, LakestepError
from ..secrets import mask_url
from . import appends, signals

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DatabaseTimeouts:
    """How long lakestep waits for the catalog database (seconds).

    ``statement``: PostgreSQL: the server cancels a statement running longer
    (lock waits included); the client gives up ``grace`` seconds later if no
    answer came at all. SQLite: how long a statement waits for a lock that
    another process holds on the file (the busy timeout), then fails with
    :class:`CatalogUnavailableError`. The others are PostgreSQL's:
    ``connect``; ``pool``: how long a call waits for a free pooled
    connection; ``keepalive_idle``: idle seconds before TCP keepalive probes
    start; ``idle_in_transaction`` (None: never): the server ends a session
    that waited this long inside a transaction for its client, releasing its
    locks (the client's next statement then fails with
    :class:`CatalogUnavailableError`). Only for clients whose transactions
    never wait on their own work, such as the coordinator.
    """

    connect: float = 10.0
    statement: float = 60.0
    grace: float = 10.0
    pool: float = 30.0
    keepalive_idle: int = 30
    idle_in_transaction: float | None = None

    def __post_init__(self) -> None:
        for name in ("connect", "statement", "grace", "pool", "keepalive_idle", "idle_in_transaction"):
            value = getattr(self, name)
            if value is None and name == "idle_in_transaction":
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise InvalidArgumentError(f"timeout {name} must be a positive number of seconds, got {value!r}",
                                           argument=name, value=value)


# ------------------------------------------------------------------ errors
def is_transient(exc: BaseException) -> bool:
    """A database error after which reconnecting and retrying may succeed."""
    if isinstance(exc, sa.exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        if isinstance(exc, sa.exc.OperationalError):
            if _corrupt(exc):
                return False
            return True  # lost connection, server shutting down, database is locked
        orig = exc.orig
        code = getattr(orig, "pgcode", None)
        # serialization_failure, deadlock_detected, query_canceled (statement timeout), admin shutdown
        return code in ("40001", "40P01", "57014", "57P01", "57P02", "57P03")
    return False


def _corrupt(exc: sa.exc.DBAPIError) -> bool:
    text = str(exc.orig).lower()
    return "file is not a database" in text or "malformed" in text or "not a database" in text


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return mask_url(text.splitlines()[0] if text else type(exc).__name__)


def unavailable(exc: BaseException, *, outcome_unknown: bool = False, what: str = "") -> CatalogUnavailableError:
    return CatalogUnavailableError(
        f"the catalog database is unavailable{what}: {_first_line(exc)}", outcome_unknown=outcome_unknown
    )


def translate(exc: BaseException, *, where: str) -> LakestepError | None:
    """The lakestep error for a database or pool error (None: let it through)."""
    if isinstance(exc, LakestepError) or isinstance(exc, sa.exc.IntegrityError):
        return None
    if isinstance(exc, sa.exc.TimeoutError):
        return CatalogUnavailableError(f"no free connection to the catalog database ({where}): {exc}"
                                       .split(" (Background")[0])
    if isinstance(exc, sa.exc.DBAPIError):
        if _corrupt(exc):
            return CatalogCorruptError(f"the catalog database is damaged or not a lakestep catalog ({where}): "
                                       f"{_first_line(exc)}")
        if is_transient(exc):
            return unavailable(exc)
        return CatalogError(f"the catalog database refused a statement ({where}): {_first_line(exc)}")
    if isinstance(exc, sa.exc.SQLAlchemyError):
        return CatalogError(f"catalog database error ({where}): {_first_line(exc)}")
    return None


@contextlib.contextmanager
def _seam(where: str) -> Iterator[None]:
    try:
        yield
    except Exception as e:
        typed = translate(e, where=where)
        if typed is None:
            raise
        raise typed from e


# ------------------------------------------------------------------ backends
def _rollback(conn: Connection) -> None:
    """End the explicit transaction after an error; a dead connection is just discarded."""
    if conn.invalidated or conn.closed:
        return
    with contextlib.suppress(sa.exc.SQLAlchemyError):
        conn.exec_driver_sql("ROLLBACK")


@dataclass
class Backend:
    engine: Engine
    name: str
    row_locks: bool

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        """A connection inside a write transaction; commits on a clean exit."""
        with _seam("write"), self.engine.begin() as conn:
            yield conn
        signals.changed()

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        with _seam("read"), self.engine.connect() as conn:
            yield conn

    @contextlib.contextmanager
    def statement(self) -> Iterator[Connection]:
        """A connection for ONE statement, a snapshot on its own (no transaction
        round trips where the database allows it)."""
        with self.read() as conn:
            yield conn

    def catalog_lock(self, conn: Connection) -> None:
        """Serialize schema upgrades between processes (inside ``write()``)."""

    def check_empty(self, conn: Connection) -> None:
        """Before creating the catalog's schema: refuse a database that already holds
        lakestep-named objects without a lakestep version (nothing is changed)."""
        from .migrations import lakestep_objects

        found = lakestep_objects(conn)
        if found:
            raise CatalogCorruptError(
                f"the database holds {found} but no lakestep catalog version: it is not a lakestep catalog, or a "
                "damaged one. lakestep creates its schema only where none of these exist; nothing was changed")

    def append(self, conn: Connection, changes: Sequence[Any], txn: dict[str, Any]) -> list[Any]:
        """Commit blind appends and upserts inside ``conn``'s write transaction: this
        backend's one blind-append implementation (appends.py)."""
        raise NotImplementedError

    def commit_blind(self, change: Any, txn: dict[str, Any]) -> Any:
        """Commit one blind append or upsert on the fast path (appends.py)."""
        raise NotImplementedError

    @property
    def prepared_statements(self) -> bool:
        """PostgreSQL: whether hot statements are PREPAREd per server session (see
        :func:`create_backend`); settable, for connections checked out afterwards."""
        return bool(self.engine.get_execution_options().get("lakestep_prepared", True))

    @prepared_statements.setter
    def prepared_statements(self, value: bool) -> None:
        self.engine.update_execution_options(lakestep_prepared=bool(value))

    def dispose(self) -> None:
        self.engine.dispose()


class SQLiteBackend(Backend):
    def __init__(self, engine: Engine, path: str) -> None:
        super().__init__(engine=engine, name="sqlite", row_locks=False)
        self.path = path
        self.lock_path = path + ".lock"

    _OWN_FILES = ("", "-wal", "-shm", "-journal", ".lock")

    def check_empty(self, conn: Connection) -> None:
        """A SQLite catalog file is lakestep's alone: any table in it is refused."""
        tables = sorted(sa.inspect(conn).get_table_names())
        if tables:
            raise CatalogCorruptError(
                f"{self.path!r} is a SQLite database with tables {tables} but no lakestep catalog: lakestep creates "
                "its catalog only in a new or empty file; nothing was changed")

    @classmethod
    def check_file(cls, path: str) -> None:
        """Before the first connection (which would write a header into it): a 0-byte
        catalog file beside other files is a catalog lost or truncated, not a new one."""
        if not (os.path.isfile(path) and os.path.getsize(path) == 0):
            return
        directory = os.path.dirname(path)
        own = {os.path.basename(path) + suffix for suffix in cls._OWN_FILES}
        others = sorted(set(os.listdir(directory)) - own)
        if others:
            raise CatalogCorruptError(
                f"{path!r} is empty (0 bytes) but its directory holds {others[:5]}: the catalog was lost or "
                "truncated, and creating a new one would hide every table. Restore the file from a backup (or "
                "delete it to really start a new catalog); nothing was changed")

    def _lock_fd(self) -> int:
        try:  # O_CREAT: a lock file that vanished is made again
            return os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            if not os.path.isdir(os.path.dirname(self.lock_path)):
                raise CatalogUnavailableError(
                    f"the catalog's directory {os.path.dirname(self.lock_path)!r} is gone: {e.strerror}") from e
            raise CatalogError(
                f"cannot open the catalog's write lock {self.lock_path!r}: {e.strerror} (lakestep needs write "
                "access to the catalog's directory to change the catalog)") from e

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        fd = self._lock_fd()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with _seam("write"), self.engine.connect() as conn:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    _rollback(conn)
                    raise
                conn.exec_driver_sql("COMMIT")
        finally:
            os.close(fd)  # closing the descriptor releases the flock
        signals.changed()

    def append(self, conn: Connection, changes: Sequence[Any], txn: dict[str, Any]) -> list[Any]:
        return appends.sqlite_append(conn, changes, txn)

    def commit_blind(self, change: Any, txn: dict[str, Any]) -> Any:
        with self.write() as conn:
            return self.append(conn, [change], txn)[0]

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        # One deferred transaction so that several statements see one snapshot.
        with _seam("read"), self.engine.connect() as conn:
            conn.exec_driver_sql("BEGIN")
            try:
                yield conn
            finally:
                _rollback(conn)


class PostgresBackend(Backend):
    """Autocommit connections with explicit transactions (see the module docstring)."""

    def __init__(self, engine: Engine, timeouts: DatabaseTimeouts) -> None:
        super().__init__(engine=engine, name="postgresql", row_locks=True)
        self.timeouts = timeouts

    @contextlib.contextmanager
    def _transaction(self, begin: str, end: str, where: str) -> Iterator[Connection]:
        with _seam(where), self._begun(begin) as conn:
            try:
                yield conn
            except BaseException:
                _rollback(conn)
                raise
            conn.exec_driver_sql(end)

    @contextlib.contextmanager
    def _begun(self, begin: str) -> Iterator[Connection]:
        """A pooled connection with ``begin`` sent. A pooled connection that turns out
        dead at ``BEGIN`` (the server restarted since) is replaced, once."""
        for attempt in (1, 2):
            conn = self.engine.connect()
            try:
                conn.exec_driver_sql(begin)
            except sa.exc.DBAPIError as e:
                conn.close()
                if attempt == 1 and e.connection_invalidated:
                    continue
                raise
            break
        with conn:
            yield conn

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        with self._transaction("BEGIN", "COMMIT", "write") as conn:
            yield conn
        signals.changed()

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        # REPEATABLE READ: several statements of one read see one snapshot.
        with self._transaction("BEGIN ISOLATION LEVEL REPEATABLE READ", "ROLLBACK", "read") as conn:
            yield conn

    @contextlib.contextmanager
    def statement(self) -> Iterator[Connection]:
        # Autocommit: one statement is its own snapshot, with no BEGIN/ROLLBACK round trips.
        with _seam("read"), self.engine.connect() as conn:
            yield conn

    def catalog_lock(self, conn: Connection) -> None:
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(7362842190)"))

    def append(self, conn: Connection, changes: Sequence[Any], txn: dict[str, Any]) -> list[Any]:
        return appends.postgres_append(conn, changes, txn, autocommit=False)

    def commit_blind(self, change: Any, txn: dict[str, Any]) -> Any:
        _failpoints.hit("commit.locked")
        with _seam("commit"), self.engine.connect() as conn:  # autocommit: one statement, one round trip
            result = appends.postgres_append(conn, [change], txn, autocommit=True)[0]
            signals.changed()
            _failpoints.hit("commit.after_db_commit")
            return result


# ------------------------------------------------------------ the watchdog
class _Watchdog:
    """Shuts down the socket of a PostgreSQL statement that got no answer in time.

    The executing thread registers its connection before sending a statement
    and unregisters it when the answer came (or an error); while registered,
    the descriptor belongs to that connection, so shutting it down never hits
    another socket. The driver then fails the call as a lost connection.

    The watching thread sleeps until the earliest deadline it holds and is woken
    only by a statement whose deadline comes before that one (every statement of
    a catalog has the same timeout, so almost never): a statement costs a heap
    push and a dictionary entry, not a thread switch. Deadlines of statements
    that were answered are dropped when the thread reaches them.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._live: dict[int, tuple[int, float]] = {}  # token -> (fd, deadline)
        self._heap: list[tuple[float, int]] = []
        self._tokens = itertools.count(1)
        self._thread: threading.Thread | None = None
        self.fired: set[int] = set()
        self.wakeups = 0  # times the watching thread woke (tests/catalog/test_faults.py)

    def arm(self, fd: int, seconds: float) -> int:
        token = next(self._tokens)
        deadline = time.monotonic() + seconds
        with self._cond:
            self._live[token] = (fd, deadline)
            heapq.heappush(self._heap, (deadline, token))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lakestep-db-watchdog", daemon=True)
                self._thread.start()
            elif self._heap[0][1] == token:  # due before what the thread sleeps until
                self._cond.notify()
        return token

    def disarm(self, token: int) -> bool:
        """True if the statement had timed out (its socket was shut down)."""
        with self._cond:
            self._live.pop(token, None)
            if token in self.fired:
                self.fired.discard(token)
                return True
            return False

    def _run(self) -> None:
        with self._cond:
            while True:
                self.wakeups += 1
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait(60.0)
                    if not self._heap:
                        self._thread = None
                        return
                    continue
                deadline, token = self._heap[0]
                now = time.monotonic()
                if deadline > now:
                    self._cond.wait(deadline - now)
                    continue
                heapq.heappop(self._heap)
                fd, _ = self._live.pop(token)
                self.fired.add(token)
                try:
                    s = socket.socket(fileno=os.dup(fd))
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    finally:
                        s.close()
                    log.warning("the catalog database gave no answer in time: connection dropped")
                except OSError as e:  # pragma: no cover - the socket went away meanwhile
                    log.debug("watchdog: %s", e)


_WATCHDOG = _Watchdog()


def _install_watchdog(engine: Engine, seconds: float) -> None:
    @event.listens_for(engine, "before_cursor_execute")
    def _arm(conn: Any, cursor: Any, statement: Any, params: Any, context: Any, many: Any) -> None:
        try:
            fd = conn.connection.dbapi_connection.fileno()
        except Exception:  # pragma: no cover - not a socket connection
            return
        conn.info["lakestep_watch"] = _WATCHDOG.arm(fd, seconds)

    def _disarm(conn: Any) -> bool:
        token = conn.info.pop("lakestep_watch", None)
        return token is not None and _WATCHDOG.disarm(token)

    @event.listens_for(engine, "after_cursor_execute")
    def _done(conn: Any, cursor: Any, statement: Any, params: Any, context: Any, many: Any) -> None:
        _disarm(conn)

    @event.listens_for(engine, "handle_error")
    def _failed(ctx: Any) -> None:
        if ctx.connection is not None and _disarm(ctx.connection):
            ctx.is_disconnect = True
            raise CatalogUnavailableError(
                f"the catalog database gave no answer within {seconds:g} s; the connection was dropped")


# ------------------------------------------------------------------ settings
def prepared_statements(conn: Connection) -> bool:
    """Whether hot statements may be PREPAREd on ``conn``'s server session (PostgreSQL):
    the ``prepared_statements`` setting of the catalog that opened it."""
    return bool(conn.get_execution_options().get("lakestep_prepared", True))


def _prepared_default() -> bool:
    """``LAKESTEP_PG_PREPARED`` (default on): read once, when a catalog opens without the setting."""
    return os.environ.get("LAKESTEP_PG_PREPARED", "1").strip().lower() not in ("0", "false", "no", "off")


# ------------------------------------------------------------------ factory
def _sqlite_path(url: sa.URL) -> str:
    db = url.database
    if not db or db == ":memory:":
        raise CatalogError("lakestep needs a SQLite *file* (several processes share it), not :memory:")
    return os.path.abspath(db)


def create_backend(url: str, *, echo: bool = False, pool_size: int = 5,
                   timeouts: DatabaseTimeouts | None = None, prepared_statements: bool | None = None) -> Backend:
    """Open the metadata database at ``url`` (any SQLAlchemy URL of a supported kind).

    ``prepared_statements`` (PostgreSQL): the barrier layer's hot statements are
    PREPAREd once per server session; False sends plain SQL (behind pgbouncer's
    transaction pooling). None: ``LAKESTEP_PG_PREPARED``, default on."""
    timeouts = timeouts or DatabaseTimeouts()
    try:
        parsed = sa.make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        raise CatalogError(f"not a database URL: {mask_url(str(url))!r}") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        path = _sqlite_path(parsed)
        directory = os.path.dirname(path)
        try:
            os.makedirs(directory, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as e:
            raise CatalogError(f"cannot put a catalog at {path!r}: {directory!r} is a file, not a directory") from e
        except PermissionError as e:
            raise CatalogError(f"cannot create the catalog's directory {directory!r}: {e.strerror}") from e
        SQLiteBackend.check_file(path)
        engine = sa.create_engine(
            parsed.set(database=path),
            echo=echo,
            connect_args={"isolation_level": None, "timeout": float(timeouts.statement), "check_same_thread": False},
        )
        busy_ms = max(1, int(timeouts.statement * 1000))

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute(f"PRAGMA busy_timeout={busy_ms}")
            cur.close()

        return SQLiteBackend(engine, path)
    if backend == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg2")
        # The server-side statement timeout rides on libpq's ``options``, with the URL's own.
        options = " ".join(filter(None, [str(parsed.query.get("options", "")),
                                         f"-c statement_timeout={int(timeouts.statement * 1000)}"]
                                        + ([] if timeouts.idle_in_transaction is None else
                                           [f"-c idle_in_transaction_session_timeout="
                                            f"{max(1, int(timeouts.idle_in_transaction * 1000))}"])))
        engine = sa.create_engine(
            parsed,
            echo=echo,
            pool_size=pool_size,
            max_overflow=10,
            pool_recycle=3600,
            pool_timeout=timeouts.pool,
            isolation_level="AUTOCOMMIT",
            execution_options={"lakestep_prepared": _prepared_default() if prepared_statements is None
                               else bool(prepared_statements)},
            connect_args={
                "connect_timeout": max(1, round(timeouts.connect)),
                "application_name": str(parsed.query.get("application_name", "lakestep")),
                "keepalives": 1,
                "keepalives_idle": timeouts.keepalive_idle,
                "keepalives_interval": max(1, timeouts.keepalive_idle // 3),
                "keepalives_count": 3,
                "options": options,
            },
        )
        _install_watchdog(engine, timeouts.statement + timeouts.grace)
        return PostgresBackend(engine, timeouts)
    raise CatalogError(
        f"unsupported catalog database {backend!r}: lakestep supports sqlite and postgresql"
    )
