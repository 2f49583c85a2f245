"""The catalog: namespaces, tables and multi-table transactions over one database."""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from typing import Any, Callable, Iterable, Mapping, Sequence

import pyarrow as pa
import sqlalchemy as sa

from ..errors import (
    CatalogError,
    CommitConflict,
    InvalidIdentifierError,
    InvalidLocationError,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NamespaceNotFoundError,
    TableAlreadyExistsError,
    TableNotFoundError,
    TransactionClosedError,
)
from . import appends
from . import schema as S
from .backend import Backend, create_backend, is_transient, unavailable
from .commit import CommitResult, NeedsRebase, Operation, TableChange, commit_once, find_txn, new_txn_uuid, txn_results
from .files import FileWriter, NewFile, check_identifier, check_relative_path, is_within, normalize_location, resolve_filesystem
from .predicates import Filter, Predicate
from .table import Table, TableMeta
from .writes import (
    PartitionSpec,
    change_of,
    prepare_append,
    prepare_compact,
    prepare_delete,
    prepare_overwrite,
    prepare_pk_delete,
    prepare_pk_update,
    prepare_rewrite_file,
    prepare_update,
)

log = logging.getLogger(__name__)

MAX_REBASES = 20


def parse_ident(ident: str | Sequence[str]) -> tuple[str, str]:
    """``"ns.name"`` or ``("ns", "name")`` -> (namespace, name), validated."""
    if isinstance(ident, str):
        parts = ident.split(".")
    elif isinstance(ident, (tuple, list)):
        parts = list(ident)
    else:
        raise InvalidIdentifierError(f"a table identifier is 'namespace.name', got {ident!r}", identifier=str(ident))
    if len(parts) != 2:
        raise InvalidIdentifierError(
            f"a table identifier is 'namespace.name' (exactly one dot), got {ident!r}", identifier=str(ident)
        )
    return check_identifier(parts[0], "namespace"), check_identifier(parts[1], "table name")


class Catalog:
    """The lakestep metadata catalog.

    ``url`` is a SQLAlchemy database URL: a SQLite file (the default, inside the
    warehouse) or PostgreSQL (``postgresql://user@host/db``). ``warehouse`` is
    where managed tables put their data: a local directory or any URI pyarrow's
    filesystems open (``s3://bucket/prefix``). It is stored in the catalog when
    the catalog is created, so later opens need only the URL.

    Example::

        from lakestep import Catalog
        cat = Catalog(warehouse="./wh")            # SQLite at ./wh/catalog.db
        cat.create_namespace("shop", exist_ok=True)
        orders = cat.create_table("shop.orders", pa.schema([("id", pa.int64())]), exist_ok=True)
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        warehouse: str | None = None,
        create: bool = True,
        commit_retries: int = 5,
        echo: bool = False,
    ) -> None:
        if url is None:
            if warehouse is None:
                raise ValueError("Catalog needs a database url, a warehouse, or both")
            if "://" in warehouse and not warehouse.startswith("file://"):
                raise ValueError("a SQLite catalog needs a local warehouse; give a database url for remote storage")
            wh = normalize_location(warehouse)
            url = f"sqlite:///{os.path.join(wh, 'catalog.db')}"
        self.url = url
        self.commit_retries = commit_retries
        self.backend: Backend = create_backend(url, echo=echo)
        self.warehouse = self._init(warehouse, create)

    # ------------------------------------------------------------------ set-up
    def _init(self, warehouse: str | None, create: bool) -> str:
        try:
            with self.backend.write() as conn:
                self.backend.catalog_lock(conn)
                found = S.current_version(conn)
                if found == 0 and not create:
                    raise CatalogError(f"no lakestep catalog at {self._safe_url()} (create=False)")
                S.upgrade(conn)
                row = conn.execute(sa.select(S.meta.c.value).where(S.meta.c.key == "warehouse")).first()
                if row is None:
                    if warehouse is None:
                        if self.backend.name != "sqlite":
                            raise CatalogError("a new catalog needs warehouse= (where table data goes)")
                        warehouse = os.path.dirname(self.backend.engine.url.database or ".")
                    wh = normalize_location(warehouse)
                    conn.execute(sa.insert(S.meta).values(key="warehouse", value=wh))
                    return wh
                stored = row[0]
                if warehouse is not None and normalize_location(warehouse) != stored:
                    raise CatalogError(
                        f"this catalog's warehouse is {stored!r}, not {normalize_location(warehouse)!r}"
                    )
                return stored
        except sa.exc.DBAPIError as e:
            if is_transient(e):
                raise unavailable(e) from e
            raise

    def _safe_url(self) -> str:
        return sa.make_url(self.url).render_as_string(hide_password=True)

    def __repr__(self) -> str:
        return f"Catalog({self._safe_url()!r}, warehouse={self.warehouse!r})"

    def close(self) -> None:
        self.backend.dispose()

    def __enter__(self) -> "Catalog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -------------------------------------------------------------- namespaces
    def create_namespace(self, name: str, properties: Mapping[str, str] | None = None, *,
                         exist_ok: bool = False) -> None:
        check_identifier(name, "namespace")
        with self.backend.write() as conn:
            exists = conn.execute(sa.select(S.namespaces.c.name).where(S.namespaces.c.name == name)).first()
            if exists:
                if exist_ok:
                    return
                raise NamespaceAlreadyExistsError(name)
            conn.execute(sa.insert(S.namespaces).values(
                name=name, properties=json.dumps(dict(properties or {})), created_at=time.time()))

    def list_namespaces(self) -> list[str]:
        with self.backend.read() as conn:
            return [r[0] for r in conn.execute(sa.select(S.namespaces.c.name).order_by(S.namespaces.c.name))]

    def drop_namespace(self, name: str) -> None:
        check_identifier(name, "namespace")
        with self.backend.write() as conn:
            tables = [r[0] for r in conn.execute(sa.select(S.tables.c.name).where(S.tables.c.namespace == name))]
            if tables:
                raise NamespaceNotEmptyError(name, tables)
            if conn.execute(sa.delete(S.namespaces).where(S.namespaces.c.name == name)).rowcount == 0:
                raise NamespaceNotFoundError(name)

    # ------------------------------------------------------------------ tables
    def create_table(
        self,
        ident: str | Sequence[str],
        schema: pa.Schema,
        *,
        partition_by: Sequence[str] = (),
        primary_key: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        location: str | None = None,
        external: bool = False,
        exist_ok: bool = False,
    ) -> Table:
        """Create a table (version 0, empty) and return it.

        Columns of ``partition_by`` split the data into files per value;
        ``primary_key`` columns become non-nullable. A ``location`` outside the
        warehouse is refused unless ``external=True``.
        """
        ns, name = parse_ident(ident)
        if not isinstance(schema, pa.Schema):
            raise TypeError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
        if len(schema) == 0:
            raise ValueError("a table needs at least one column")
        for f in schema:
            check_identifier(f.name, "column name")
        if len(set(schema.names)) != len(schema.names):
            raise ValueError(f"duplicate column names in {schema.names}")
        for col in list(partition_by) + list(primary_key):
            if schema.get_field_index(col) < 0:
                raise ValueError(f"{col!r} is not a column of the schema ({schema.names})")
        for col in partition_by:
            t = schema.field(col).type
            if pa.types.is_nested(t) or pa.types.is_floating(t) or pa.types.is_binary(t):
                raise ValueError(f"cannot partition by {col!r} of type {t}")
        if primary_key and not set(partition_by) <= set(primary_key):
            raise ValueError(f"partition columns {list(partition_by)} must be part of the primary key {list(primary_key)}")
        if primary_key:
            schema = pa.schema([f.with_nullable(False) if f.name in primary_key else f for f in schema],
                               metadata=schema.metadata)
        props = {str(k): str(v) for k, v in (properties or {}).items()}
        if location is None:
            sep = "/" if "://" in self.warehouse else os.sep
            location = f"{self.warehouse}{sep}{ns}{sep}{name}-{uuid.uuid4().hex[:8]}"
        loc = normalize_location(location)
        if not external and not is_within(loc, self.warehouse):
            raise InvalidLocationError(
                f"location {location!r} is outside the warehouse {self.warehouse!r}; pass external=True "
                "to create an external table there", location=location)
        resolve_filesystem(loc)  # fail early on a scheme pyarrow cannot open
        now = time.time()
        with self.backend.write() as conn:
            if conn.execute(sa.select(S.namespaces.c.name).where(S.namespaces.c.name == ns)).first() is None:
                raise NamespaceNotFoundError(ns)
            existing = conn.execute(S.tables.select().where(S.tables.c.namespace == ns, S.tables.c.name == name)).mappings().first()
            if existing is not None:
                if exist_ok:
                    return Table(self, TableMeta.from_row(existing))
                raise TableAlreadyExistsError(f"{ns}.{name}")
            if not external:
                clash = conn.execute(sa.select(S.tables.c.table_id).where(S.tables.c.location == loc)).first()
                if clash:
                    raise InvalidLocationError(f"location {loc!r} is used by another table", location=loc)
            table_id = conn.execute(
                sa.insert(S.tables).values(
                    namespace=ns, name=name, location=loc, external=external,
                    schema_ipc=schema.serialize().to_pybytes(),
                    partition_by=json.dumps(list(partition_by)), primary_key=json.dumps(list(primary_key)),
                    properties=json.dumps(props), created_at=now, version=0, data_version=0, last_commit_at=now,
                ).returning(S.tables.c.table_id)
            ).scalar_one()
            conn.execute(sa.insert(S.commits).values(
                table_id=table_id, version=0, data_version=0, operation=Operation.CREATE.value, base_version=0,
                committed_at=now, summary="{}"))
            row = conn.execute(S.tables.select().where(S.tables.c.table_id == table_id)).mappings().one()
        FileWriter(loc).fs.create_dir(resolve_filesystem(loc)[1], recursive=True)
        log.info("created table %s.%s at %s", ns, name, loc)
        return Table(self, TableMeta.from_row(row))

    def load_table(self, ident: str | Sequence[str]) -> Table:
        ns, name = parse_ident(ident)
        with self.backend.read() as conn:
            row = conn.execute(S.tables.select().where(S.tables.c.namespace == ns, S.tables.c.name == name)).mappings().first()
        if row is None:
            raise TableNotFoundError(f"{ns}.{name}")
        return Table(self, TableMeta.from_row(row))

    def table_exists(self, ident: str | Sequence[str]) -> bool:
        try:
            self.load_table(ident)
            return True
        except TableNotFoundError:
            return False

    def list_tables(self, namespace: str | None = None) -> list[str]:
        q = sa.select(S.tables.c.namespace, S.tables.c.name).order_by(S.tables.c.namespace, S.tables.c.name)
        if namespace is not None:
            q = q.where(S.tables.c.namespace == check_identifier(namespace, "namespace"))
        with self.backend.read() as conn:
            return [f"{r[0]}.{r[1]}" for r in conn.execute(q)]

    def rename_table(self, old: str | Sequence[str], new: str | Sequence[str]) -> Table:
        ons, oname = parse_ident(old)
        nns, nname = parse_ident(new)
        with self.backend.write() as conn:
            if conn.execute(sa.select(S.namespaces.c.name).where(S.namespaces.c.name == nns)).first() is None:
                raise NamespaceNotFoundError(nns)
            if conn.execute(sa.select(S.tables.c.table_id).where(S.tables.c.namespace == nns, S.tables.c.name == nname)).first():
                raise TableAlreadyExistsError(f"{nns}.{nname}")
            res = conn.execute(sa.update(S.tables).where(S.tables.c.namespace == ons, S.tables.c.name == oname)
                               .values(namespace=nns, name=nname))
            if res.rowcount == 0:
                raise TableNotFoundError(f"{ons}.{oname}")
        return self.load_table((nns, nname))

    def drop_table(self, ident: str | Sequence[str], *, purge: bool = False) -> None:
        """Remove a table from the catalog; ``purge=True`` also deletes its data files."""
        table = self.load_table(ident)
        with self.backend.write() as conn:
            tid = table.table_id
            conn.execute(sa.delete(S.files).where(S.files.c.table_id == tid))
            conn.execute(sa.delete(S.commits).where(S.commits.c.table_id == tid))
            if conn.execute(sa.delete(S.tables).where(S.tables.c.table_id == tid)).rowcount == 0:
                raise TableNotFoundError(table.ident)
        if purge:
            fs, path = resolve_filesystem(table.location)
            try:
                fs.delete_dir(path)
            except FileNotFoundError:
                pass
        log.info("dropped table %s%s", table.ident, " and its files" if purge else "")

    # ------------------------------------------------------------ transactions
    def transaction(self, *, job_id: str | None = None, batch_id: int | None = None) -> "Transaction":
        """A transaction over any number of tables: all commit, or none.

        ``(job_id, batch_id)`` makes it idempotent: committing the same key again
        returns the first result and changes nothing.
        """
        if job_id is not None:
            check_identifier(job_id.replace("-", "_").replace(".", "_").replace(":", "_"), "job id")
            if batch_id is None:
                raise ValueError("an idempotency key needs batch_id together with job_id")
        elif batch_id is not None:
            raise ValueError("batch_id needs job_id")
        return Transaction(self, job_id=job_id, batch_id=batch_id)

    def _table(self, table: Table | str) -> Table:
        return table if isinstance(table, Table) else self.load_table(table)

    def commit_changes(
        self, changes: Sequence[TableChange], *, job_id: str | None = None, batch_id: int | None = None
    ) -> list[CommitResult]:
        """Commit prepared changes in one database transaction (see ``commit.py``)."""
        return self.commit_guarded(changes, job_id=job_id, batch_id=batch_id)[1]

    def commit_guarded(
        self,
        changes: Sequence[TableChange],
        *,
        guard: "Callable[[sa.Connection], list[CommitResult] | None] | None" = None,
        after: "Callable[[sa.Connection, list[CommitResult]], None] | None" = None,
        job_id: str | None = None,
        batch_id: int | None = None,
    ) -> tuple[bool, list[CommitResult]]:
        """Commit ``changes`` in one database transaction; returns (committed, results).

        ``guard`` runs first in that transaction: it returns None to go on, or
        results to return without committing (a replay); it may fill
        ``changes`` in (rollback computes them under its locks). ``after``
        runs in the same transaction, after the commit. An overwrite rebases
        onto files that landed concurrently; transient database errors are
        retried, and a commit that landed before its connection broke is found
        by its uuid; a concurrent commit with the same ``(job_id, batch_id)``
        returns that one's results (committed=False).
        """
        txn_uuid = new_txn_uuid()
        attempts = rebases = 0
        fast = guard is None and after is None and appends.eligible(changes)
        while True:
            try:
                if fast:  # one blind append/upsert: the streaming hot path
                    txn = {"txn_uuid": txn_uuid, "job_id": job_id, "committed_at": time.time(),
                           "batch_id": None if job_id is None else int(batch_id or 0)}
                    return True, [self.backend.commit_blind(changes[0], txn)]
                with self.backend.write() as conn:
                    stop = guard(conn) if guard is not None else None
                    if stop is not None:
                        return False, stop
                    results = commit_once(conn, changes, txn_uuid=txn_uuid, job_id=job_id, batch_id=batch_id)
                    if after is not None:
                        after(conn, results)
                    return True, results
            except NeedsRebase as nr:
                rebases += 1
                if rebases > MAX_REBASES or nr.change.rebase is None:
                    raise CommitConflict(
                        table=nr.change.ident, operation=nr.change.operation.value,
                        base_version=nr.change.base_version, other_version=-1, other_operation="?",
                        reason="concurrent commits kept changing the overwritten range") from None
                log.info("rebasing %s onto %d concurrently added file(s)", nr.change.ident, len(nr.files))
                nr.change.rebase(nr.change, nr.files)
            except sa.exc.IntegrityError:
                if job_id is None:
                    raise
                log.info("transaction (%s, %s) was committed before: returning its result", job_id, batch_id)
                # A concurrent commit with the same idempotency key won the race.
                with self.backend.read() as conn:
                    prior = find_txn(conn, key=(job_id, int(batch_id or 0)))
                    if prior is None:
                        raise
                    return False, txn_results(conn, prior, {c.table_id: c.ident for c in changes})
            except sa.exc.DBAPIError as e:
                if not is_transient(e):
                    raise
                attempts += 1
                known = False
                try:  # did it land before the connection broke?
                    with self.backend.read() as conn:
                        prior = find_txn(conn, txn_uuid=txn_uuid)
                        known = True
                        if prior is not None:
                            log.warning("commit landed before the connection broke; returning its result")
                            return True, txn_results(conn, prior, {c.table_id: c.ident for c in changes})
                except sa.exc.DBAPIError:
                    pass
                if attempts > self.commit_retries:
                    raise unavailable(e, outcome_unknown=not known) from e
                delay = min(2.0, 0.05 * 2 ** attempts)
                log.warning("catalog database error (%s); retry %d/%d in %.2fs", type(e.orig).__name__,
                            attempts, self.commit_retries, delay)
                time.sleep(delay)


class Transaction:
    """Changes to one or more tables that commit atomically.

    Use it as a context manager: a clean exit commits, an exception aborts
    (nothing becomes visible). Each table takes one write per transaction,
    except appends, which accumulate. Data files are written when a method is
    called; the commit only publishes them.

    Example::

        with catalog.transaction(job_id="orders_etl", batch_id=42) as tx:
            tx.append("shop.orders", orders)
            tx.overwrite("shop.daily", daily, partitions="dynamic")
        tx.results   # one CommitResult per table
    """

    def __init__(self, catalog: Catalog, *, job_id: str | None, batch_id: int | None) -> None:
        self.catalog = catalog
        self.job_id = job_id
        self.batch_id = batch_id
        self.changes: dict[int, TableChange] = {}
        self.results: list[CommitResult] = []
        self.noops: list[CommitResult] = []  # writes with nothing to do (a compaction of nothing)
        self.closed = False

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.closed:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def _add(self, change: TableChange) -> None:
        if self.closed:
            raise TransactionClosedError("transaction already committed or aborted")
        prior = self.changes.get(change.table_id)
        if change.operation is Operation.COMPACT and not change.removed and prior is None:
            # nothing to merge: no commit, no new version
            self.noops.append(CommitResult(
                table=change.ident, version=change.base_version, data_version=change.base_data_version,
                operation=change.operation.value, base_version=change.base_version,
                summary={"noop": True}))
            return
        if prior is None:
            self.changes[change.table_id] = change
        elif change.blind and prior.blind and prior.operation is change.operation and prior.barrier == change.barrier:
            prior.added.extend(change.added)
        else:
            self._discard_files(change)
            raise ValueError(
                f"{change.ident} already has a {prior.operation.value} in this transaction; "
                "a table takes one write per transaction (appends accumulate)"
            )

    def append(self, table: Table | str, data: Any, *, barrier: int | None = None, prefix: str = "") -> None:
        self._check_open()
        self._add(prepare_append(self.catalog._table(table), data, barrier=barrier, prefix=prefix))

    def overwrite(self, table: Table | str, data: Any, *, partitions: PartitionSpec = None,
                  where: Filter | Predicate | None = None, barrier: int | None = None, prefix: str = "") -> None:
        self._check_open()
        self._add(prepare_overwrite(self.catalog._table(table), data, partitions=partitions, where=where,
                                    barrier=barrier, prefix=prefix))

    def add_files(self, table: Table | str, files: Sequence[NewFile], *, mode: str = "append",
                  barrier: int | None = None) -> None:
        """Commit data files that were written elsewhere (by Spark executors, say).

        ``mode``: ``append`` (on a primary-key table: upsert, as the files were
        written in the table's physical form) or ``overwrite`` (replace
        everything live with these files). The files must lie under the
        table's location and match its schema: whoever wrote them checked that.
        """
        self._check_open()
        t = self.catalog._table(table)
        if mode not in ("append", "overwrite"):
            raise ValueError(f"mode must be 'append' or 'overwrite', got {mode!r}")
        for f in files:
            check_relative_path(f.path)
        if mode == "append":
            op = Operation.MERGE if t.primary_key else Operation.APPEND
            change = TableChange(table_id=t.table_id, ident=t.ident, operation=op, base_version=-1,
                                 location=t.location, added=list(files), barrier=barrier)
        else:
            base, base_dv, _ = t._head_and_live()
            change = TableChange(table_id=t.table_id, ident=t.ident, operation=Operation.OVERWRITE,
                                 base_version=base, base_data_version=base_dv, location=t.location,
                                 added=list(files), barrier=barrier, summary={"scope": "all"})
        self._add(change)

    def upsert(self, table: Table | str, data: Any, *, barrier: int | None = None, prefix: str = "") -> None:
        t = self.catalog._table(table)
        if not t.primary_key:
            raise ValueError(f"{t.ident} has no primary key: use append")
        self.append(t, data, barrier=barrier, prefix=prefix)

    def delete(self, table: Table | str, where: Filter | Predicate, *, isolation: str | None = None,
               barrier: int | None = None) -> None:
        self._check_open()
        t = self.catalog._table(table)
        if t.primary_key:  # tombstones, merged on read
            self._add(prepare_pk_delete(t, where, barrier=barrier))
        else:
            self._add(prepare_delete(t, where, barrier=barrier, isolation=isolation))

    def update(self, table: Table | str, set: Mapping[str, Any], where: Filter | Predicate, *,
               isolation: str | None = None, barrier: int | None = None) -> None:
        self._check_open()
        t = self.catalog._table(table)
        if t.primary_key:  # the changed rows, upserted
            self._add(prepare_pk_update(t, set, where, barrier=barrier))
        else:
            self._add(prepare_update(t, set, where, barrier=barrier, isolation=isolation))

    def compact(self, table: Table | str, *, target_file_size: int = 128 << 20, min_files: int = 2,
                major: bool = False) -> None:
        self._check_open()
        self._add(prepare_compact(self.catalog._table(table), target_file_size=target_file_size,
                                  min_files=min_files, major=major))

    def rewrite_file(self, table: Table | str, file: Any, transform: Any) -> None:
        self._check_open()
        self._add(prepare_rewrite_file(self.catalog._table(table), file, transform))

    def restore(self, table: Table | str, version: int, *, barrier: int | None = None) -> None:
        """Make ``table`` hold exactly the rows of ``version`` again (metadata only).

        A new commit, history kept: its ``base_version`` is ``version``; commits
        landing concurrently are undone too. See ``_Resolver._restore``.
        """
        from ..errors import VersionNotFoundError

        self._check_open()
        t = self.catalog._table(table)
        head = t.version
        if not 0 <= int(version) <= head:
            raise VersionNotFoundError(t.ident, f"version {version} (newest is {head})")
        self._add(change_of(
            t, operation=Operation.RESTORE, base_version=int(version), barrier=barrier, retention_seconds=t.retention_seconds,
            summary={"restored_to": int(version)},
        ))

    def _check_open(self) -> None:
        if self.closed:
            raise TransactionClosedError("transaction already committed or aborted")

    def commit(self) -> list[CommitResult]:
        self._check_open()
        self.closed = True
        changes = [self.changes[k] for k in sorted(self.changes)]
        if not changes:
            self.results = list(self.noops)
            return self.results
        try:
            self.results = self.catalog.commit_changes(changes, job_id=self.job_id, batch_id=self.batch_id)
        except CommitConflict:
            for c in changes:
                self._discard_files(c)
            raise
        for c, r in zip(changes, self.results):
            if r.discarded:
                self._discard_files(c)
        self.results = self.results + self.noops
        return self.results

    def abort(self) -> None:
        """Drop the transaction; the files it wrote are deleted (best effort)."""
        if self.closed:
            return
        self.closed = True
        for c in self.changes.values():
            self._discard_files(c)

    def _discard_files(self, change: TableChange) -> None:
        if not change.added:
            return
        try:
            writer = FileWriter(change.location)
            for f in change.added:
                writer.delete(f.path)
        except Exception as e:  # orphans are harmless; cleanup collects them
            log.debug("could not delete uncommitted files of %s: %s", change.ident, e)
