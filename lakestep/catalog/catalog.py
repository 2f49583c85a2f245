"""The catalog: namespaces, tables and multi-table transactions over one database
(:meth:`Catalog.transaction`; the :class:`Transaction` itself is in transaction.py)."""

from __future__ import annotations

import json
import logging
import os
import uuid
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import sqlalchemy as sa

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import (
    ArgumentTypeError,
    CatalogError,
    CatalogUnavailableError,
    InvalidArgumentError,
    InvalidIdentifierError,
    InvalidLocationError,
    InvalidSchemaError,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NamespaceNotFoundError,
    TableAlreadyExistsError,
    TableNotFoundError,
)
from . import locations, migrations
from . import pk as pk_mod
from . import properties as P
from . import schema as S
from .backend import Backend, DatabaseTimeouts, create_backend
from .changes import CommitResult, Operation, TableChange
from .checks import check_batch_id, check_identifier, check_job_id
from .columns import assign, plain_schema
from .commit import After, Guard, commit, find_txn, txn_results
from .handle import TableHandle, TableMeta
from .storage import Storage, normalize_location, resolve_filesystem
from .table import Table
from .transaction import Transaction
from .writer import FileWriter

log = logging.getLogger(__name__)



def _table_schema(ident: str, schema: pa.Schema, partition_by: Sequence[str],
                  primary_key: Sequence[str]) -> pa.Schema:
    """The schema a new table stores, or InvalidSchemaError: nothing of a bad definition is created."""
    if not isinstance(schema, pa.Schema):
        raise ArgumentTypeError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}", argument="schema",
                                value=schema)

    def refuse(msg: str, column: str | None = None) -> InvalidSchemaError:
        return InvalidSchemaError(f"table {ident!r}: {msg}", table=ident, column=column)

    if len(schema) == 0:
        raise refuse("a table needs at least one column")
    for f in schema:
        check_identifier(f.name, "column name")
    if len(set(schema.names)) != len(schema.names):
        raise refuse(f"duplicate column names in {schema.names}")
    for what, cols in (("partition_by", partition_by), ("primary_key", primary_key)):
        if isinstance(cols, str):
            raise refuse(f"{what} is a list of column names, got the string {cols!r}: write [{cols!r}]")
        if len(set(cols)) != len(cols):
            raise refuse(f"{what} names a column twice: {list(cols)}")
        for col in cols:
            if schema.get_field_index(col) < 0:
                raise refuse(f"{what} names {col!r}, which is not a column of the schema ({schema.names})", col)
    for col in partition_by:
        t = schema.field(col).type
        if pa.types.is_nested(t) or pa.types.is_floating(t) or pa.types.is_binary(t):
            raise refuse(f"cannot partition by {col!r} of type {t}: partition by a string, integer or date "
                         "column", col)
    for col in primary_key:
        t = schema.field(col).type
        if not _key_type_ok(t):
            raise refuse(f"primary key column {col!r} is {t}; a key column must be a string, binary, integer, "
                         "floating point, decimal, boolean, date, time or timestamp column (rows are matched "
                         "by equality on it)", col)
    if primary_key and not set(partition_by) <= set(primary_key):
        raise refuse(f"partition columns {list(partition_by)} must be part of the primary key {list(primary_key)}")
    if primary_key:
        schema = pa.schema([f.with_nullable(False) if f.name in primary_key else f for f in schema],
                           metadata=schema.metadata)
    return plain_schema(schema)  # a new table stores every column under its name (columns.py rule 6)


def _key_type_ok(t: pa.DataType) -> bool:
    """Types whose values upserts can match (sort, compare and hash-join kernels all take them)."""
    T = pa.types
    return any(f(t) for f in (T.is_integer, T.is_floating, T.is_decimal, T.is_boolean, T.is_string,
                              T.is_large_string, T.is_binary, T.is_large_binary, T.is_fixed_size_binary,
                              T.is_date, T.is_time, T.is_timestamp))


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
    ``prepared_statements=False`` (PostgreSQL behind a transaction-pooling
    pgbouncer) sends the barrier layer's statements as plain SQL; the default
    comes from ``LAKESTEP_PG_PREPARED`` (on).

    ``storage_options`` reach an object store (pyarrow ``S3FileSystem``
    options: ``endpoint_override``, ``region``, ``access_key``, ``secret_key``,
    ``session_token``, ``scheme``, ...; :class:`~lakestep.catalog.storage.Storage`).
    Without them the standard AWS environment variables and config apply.
    They are never stored in the catalog database and never printed; Spark
    data sources take them as options ``storage.<name>``.

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
        timeouts: DatabaseTimeouts | None = None,
        prepared_statements: bool | None = None,
        clock: Clock | None = None,
        storage_options: "Mapping[str, object] | Storage | None" = None,
    ) -> None:
        self.clock: Clock = clock or SYSTEM_CLOCK  # every age, lease and expiry (lakestep/clock.py)
        self.storage = Storage.of(storage_options)
        if warehouse is not None:
            locations.check_not_under_file(normalize_location(warehouse))
        if url is None:
            if warehouse is None:
                raise InvalidArgumentError("Catalog needs a database url, a warehouse, or both", argument="url",
                                           value=None)
            if "://" in warehouse and not warehouse.startswith("file://"):
                raise InvalidLocationError("a SQLite catalog needs a local warehouse; give a database url for remote "
                                           "storage", location=warehouse)
            wh = normalize_location(warehouse)
            url = f"sqlite:///{os.path.join(wh, 'catalog.db')}"
        self.commit_retries = commit_retries
        #: per primary-key table: writes through this catalog since its last compaction on write
        #: (``Table._compact_on_write``)
        self.pk_writes: dict[int, int] = {}
        self.backend: Backend = create_backend(url, echo=echo, timeouts=timeouts,
                                               prepared_statements=prepared_statements)
        try:
            self.warehouse = self._init(warehouse, create)
        except BaseException:
            self.backend.dispose()
            raise

    # ------------------------------------------------------------------ set-up
    def _init(self, warehouse: str | None, create: bool) -> str:
        """Open (and if needed create or upgrade) the catalog; returns the warehouse.

        A catalog that is current is only read (a read-only catalog opens).
        lakestep creates its schema only in a database that holds no lakestep
        objects (and, for SQLite, no tables at all): anything else is refused
        with :class:`CatalogCorruptError` and left unchanged.
        """
        try:
            with self.backend.read() as conn:
                found = migrations.current_version(conn)
                row = None
                if found:
                    row = conn.execute(sa.select(S.meta.c.value).where(S.meta.c.key == "warehouse")).first()
            if found == migrations.LATEST and row is not None:
                return self._check_warehouse(row.value, warehouse)
            with self.backend.write() as conn:
                self.backend.catalog_lock(conn)
                found = migrations.current_version(conn)
                if found == 0:
                    if not create:
                        raise CatalogError(f"no lakestep catalog at {self.url} (create=False)")
                    self.backend.check_empty(conn)
                    # a new catalog, at the newest version in one pass; its first epoch opened by its clock
                    migrations.create_latest(conn, self.clock.now())
                else:
                    migrations.upgrade(conn)
                row = conn.execute(sa.select(S.meta.c.value).where(S.meta.c.key == "warehouse")).first()
                if row is None:
                    if warehouse is None:
                        if self.backend.name != "sqlite":
                            raise CatalogError("a new catalog needs warehouse= (where table data goes)")
                        warehouse = os.path.dirname(self.backend.engine.url.database or ".")
                    wh = normalize_location(warehouse)
                    conn.execute(sa.insert(S.meta).values(key="warehouse", value=wh))
                    return wh
                return self._check_warehouse(row.value, warehouse)
        except CatalogUnavailableError as e:
            raise CatalogUnavailableError(f"cannot open the catalog at {self.url}: {e}") from e

    @staticmethod
    def _check_warehouse(stored: str, given: str | None) -> str:
        if given is not None and normalize_location(given) != stored:
            raise CatalogError(f"this catalog's warehouse is {stored!r}, not {normalize_location(given)!r}")
        return stored

    @property
    def url(self) -> str:
        """The catalog database's URL with its password masked: safe to print and log."""
        return self.backend.engine.url.render_as_string(hide_password=True)

    def connection_url(self) -> str:
        """The full URL, password included, to hand to another process (a Spark option,
        a worker). Never log it."""
        return self.backend.engine.url.render_as_string(hide_password=False)

    def _safe_url(self) -> str:
        return self.url

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
                name=name, properties=json.dumps(dict(properties or {})), created_at=self.clock.now()))

    def list_namespaces(self) -> list[str]:
        with self.backend.read() as conn:
            return [r.name for r in conn.execute(sa.select(S.namespaces.c.name).order_by(S.namespaces.c.name))]

    def drop_namespace(self, name: str) -> None:
        check_identifier(name, "namespace")
        with self.backend.write() as conn:
            tables = [r.name for r in conn.execute(sa.select(S.tables.c.name).where(S.tables.c.namespace == name))]
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
        warehouse is refused unless ``external=True``; one that contains or lies
        inside another table's location, the warehouse root or the catalog file
        is refused (:class:`LocationOverlapError`, ``locations.py``). Properties
        are validated (``properties.py``).

        1. what the catalog already answers is refused first (a missing
           namespace, an existing table, an overlapping location);
        2. the table's directory is created and a probe file written in it, so
           an unwritable location fails (:class:`StorageError`) with no row;
        3. the row is inserted, after step 1's checks again under the catalog
           lock (two concurrent creates cannot both take overlapping places).
           Directories step 2 made are removed again if step 3 fails.
        """
        ns, name = parse_ident(ident)
        schema = _table_schema(f"{ns}.{name}", schema, partition_by, primary_key)
        props = P.validate(properties or {}, schema)
        if location is None:
            sep = "/" if "://" in self.warehouse else os.sep
            location = f"{self.warehouse}{sep}{ns}{sep}{name}-{uuid.uuid4().hex[:8]}"
        loc = normalize_location(location)
        resolve_filesystem(loc, self.storage)  # fail early on a scheme pyarrow cannot open
        # 1. refuse what the catalog already answers: no directory is made for it
        with self.backend.read() as conn:
            existing = self._check_new_table(conn, ns, name, loc, external)
        if existing is not None:
            if exist_ok:
                return Table(self, TableMeta.from_row(existing))
            raise TableAlreadyExistsError(f"{ns}.{name}")
        # 2. the directory exists and takes files before any catalog row names it
        made = self._make_location(loc)
        # 3. the row, after checking 1 again under the catalog lock
        now = self.clock.now()
        try:
            with self.backend.write() as conn:
                self.backend.catalog_lock(conn)
                existing = self._check_new_table(conn, ns, name, loc, external)
                if existing is not None:
                    row = existing
                else:
                    ids = assign(pk_mod.physical_schema(schema, primary_key) if primary_key else schema)
                    table_id = conn.execute(
                        sa.insert(S.tables).values(
                            namespace=ns, name=name, location=loc, external=external,
                            schema_ipc=schema.serialize().to_pybytes(),
                            column_ids=ids.to_json(), last_column_id=ids.last,
                            partition_by=json.dumps(list(partition_by)), primary_key=json.dumps(list(primary_key)),
                            properties=json.dumps(props), created_at=now, version=0, data_version=0,
                            last_commit_at=now, stamp=S.NextStamp(),
                        ).returning(S.tables.c.table_id)
                    ).scalar_one()
                    conn.execute(sa.insert(S.commits).values(
                        table_id=table_id, version=0, data_version=0, operation=Operation.CREATE.value,
                        base_version=0, committed_at=now, summary="{}"))
                    S.record_schema(conn, table_id, 0)
                    row = conn.execute(S.tables.select().where(S.tables.c.table_id == table_id)).mappings().one()
        except BaseException:
            self._unmake_location(made)
            raise
        if existing is not None:  # created concurrently, between 1 and 3
            self._unmake_location(made)
            if exist_ok:
                return Table(self, TableMeta.from_row(existing))
            raise TableAlreadyExistsError(f"{ns}.{name}")
        log.info("created table %s.%s at %s", ns, name, loc)
        return Table(self, TableMeta.from_row(row))

    def _check_new_table(self, conn: sa.Connection, ns: str, name: str, loc: str,
                         external: bool) -> "sa.RowMapping | None":
        """The existing row of ``ns.name`` if any; else refuse a missing namespace or an overlapping location."""
        if conn.execute(sa.select(S.namespaces.c.name).where(S.namespaces.c.name == ns)).first() is None:
            raise NamespaceNotFoundError(ns)
        existing = conn.execute(
            S.tables.select().where(S.tables.c.namespace == ns, S.tables.c.name == name)).mappings().first()
        if existing is not None:
            return existing
        others = conn.execute(sa.select(S.tables.c.namespace, S.tables.c.name, S.tables.c.location)).all()
        locations.check_new_location(loc, warehouse=self.warehouse, catalog_file=self._catalog_file(),
                                     tables=[(f"{r.namespace}.{r.name}", r.location) for r in others],
                                     external=external)
        return None

    def _catalog_file(self) -> str | None:
        """The SQLite database file (no table may hold it), or None on a database server."""
        return self.backend.engine.url.database if self.backend.name == "sqlite" else None

    def _make_location(self, loc: str) -> list[str]:
        """Create the table's directory and prove it writable; the local directories it made."""
        made: list[str] = []
        if "://" not in loc:
            d = loc
            while not os.path.lexists(d) and os.path.dirname(d) != d:
                made.append(d)
                d = os.path.dirname(d)
        try:
            FileWriter(loc, self.storage).check_writable()
        except BaseException:
            Catalog._unmake_location(made)
            raise
        return made

    @staticmethod
    def _unmake_location(made: list[str]) -> None:
        for d in made:  # deepest first; only while empty
            try:
                os.rmdir(d)
            except OSError:
                return

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
            return [f"{r.namespace}.{r.name}" for r in conn.execute(q)]

    def rename_table(self, old: str | Sequence[str], new: str | Sequence[str]) -> Table:
        ons, oname = parse_ident(old)
        nns, nname = parse_ident(new)
        with self.backend.write() as conn:
            if conn.execute(sa.select(S.namespaces.c.name).where(S.namespaces.c.name == nns)).first() is None:
                raise NamespaceNotFoundError(nns)
            if conn.execute(sa.select(S.tables.c.table_id).where(S.tables.c.namespace == nns, S.tables.c.name == nname)).first():
                raise TableAlreadyExistsError(f"{nns}.{nname}")
            res = conn.execute(sa.update(S.tables).where(S.tables.c.namespace == ons, S.tables.c.name == oname)
                               .values(namespace=nns, name=nname, stamp=S.NextStamp()))
            if res.rowcount == 0:
                raise TableNotFoundError(f"{ons}.{oname}")
        return self.load_table((nns, nname))

    def drop_table(self, ident: str | Sequence[str], *, purge: bool = False) -> None:
        """Remove a table from the catalog; ``purge=True`` also deletes its data files.

        A purge deletes the files the catalog recorded for the table and the
        orphans under its own ``data/`` directory, then the directories that
        became empty; never anything else under its location, nor anything
        inside another table's location or the catalog file (``locations.py``).
        """
        table = self.load_table(ident)
        with self.backend.write() as conn:
            tid = table.table_id
            # Readers that keep per-table facts by change stamp (schema.py, v9) cannot
            # see a deleted row: a new topology generation makes them start over.
            conn.execute(sa.update(S.topology).where(S.topology.c.id == 1)
                         .values(generation=S.topology.c.generation + 1, updated_at=self.clock.now()))
            recorded = conn.execute(sa.select(S.files.c.path).where(S.files.c.table_id == tid)).scalars().all()
            conn.execute(sa.delete(S.file_stats).where(S.file_stats.c.table_id == tid))
            conn.execute(sa.delete(S.stats_columns).where(S.stats_columns.c.table_id == tid))
            conn.execute(sa.delete(S.files).where(S.files.c.table_id == tid))
            conn.execute(sa.delete(S.commits).where(S.commits.c.table_id == tid))
            conn.execute(sa.delete(S.schemas).where(S.schemas.c.table_id == tid))
            if conn.execute(sa.delete(S.tables).where(S.tables.c.table_id == tid)).rowcount == 0:
                raise TableNotFoundError(table.ident)
        if purge:
            self._purge(table, sorted(set(recorded)))
        log.info("dropped table %s%s", table.ident, " and its files" if purge else "")

    def deletion_guard(self, table: TableHandle, *, dropped: bool = False) -> locations.Deletions:
        """What a cleanup or purge of ``table`` may delete, given every other table's location now."""
        with self.backend.read() as conn:
            q = sa.select(S.tables.c.location)
            if not dropped:
                q = q.where(S.tables.c.table_id != table.table_id)
            others = conn.execute(q).scalars().all()
        return locations.Deletions.of(table.writer, others=others, catalog_file=self._catalog_file())

    def _purge(self, table: Table, recorded: Sequence[str]) -> None:
        writer = table.writer
        guard = self.deletion_guard(table, dropped=True)
        for rel in recorded:
            if guard.allows_recorded(writer.full_path(rel)):
                writer.delete(rel)
            else:
                log.warning("purge of %s: kept %s, which resolves outside the table", table.ident, rel)
        data = writer.full_path("data")
        try:
            infos = writer.fs.get_file_info(pafs.FileSelector(data, recursive=True, allow_not_found=True))
        except OSError as e:
            log.warning("purge of %s: could not list %s: %s", table.ident, data, e)
            return
        for info in infos:
            if info.type == pafs.FileType.File and guard.allows_orphan(info.path):
                try:
                    writer.fs.delete_file(info.path)
                except FileNotFoundError:
                    pass
        if "://" not in table.location:  # empty directories, deepest first; never another table's
            dirs = [i.path for i in infos if i.type == pafs.FileType.Directory and guard.allows_orphan(i.path)]
            if not any(locations.inside(guard.data_root, f) for f in guard.foreign):
                dirs.append(data)
            if not any(f == guard.root for f in guard.foreign) and not locations.inside(
                    locations.real(self.warehouse), guard.root):  # never the warehouse root
                dirs.append(table.location)
            for d in sorted(dirs, key=lambda d: (d == table.location, -len(d))):
                try:
                    os.rmdir(d)
                except OSError:
                    pass

    # ------------------------------------------------------------ transactions
    def transaction(self, *, job_id: str | None = None, batch_id: int | None = None,
                    guard: "Guard | None" = None, after: "After | None" = None) -> "Transaction":
        """A transaction over any number of tables: all commit, or none.

        ``(job_id, batch_id)`` makes it idempotent: committing the same key again
        returns the first result and changes nothing. ``guard`` and ``after``
        run inside the commit's database transaction (see :meth:`commit_guarded`):
        the barrier layer checks a batch's plan with them.
        """
        if job_id is not None:
            check_job_id(job_id)
            if batch_id is None:
                raise InvalidArgumentError("an idempotency key needs batch_id together with job_id",
                                           argument="batch_id", value=None)
            batch_id = check_batch_id(batch_id)
        elif batch_id is not None:
            raise InvalidArgumentError("batch_id needs job_id: the idempotency key is (job_id, batch_id)",
                                       argument="job_id", value=None)
        return Transaction(self, job_id=job_id, batch_id=batch_id, guard=guard, after=after)

    def as_table(self, table: Table | str) -> Table:
        """``table`` itself when it is a :class:`Table` handle, else the table it names, loaded."""
        return table if isinstance(table, Table) else self.load_table(table)

    def recorded(self, job_id: str, batch_id: int) -> list[CommitResult] | None:
        """The commits recorded under the idempotency key ``(job_id, batch_id)``, marked
        replayed; None when the key is not recorded (never committed, or pruned)."""
        with self.backend.read() as conn:
            prior = find_txn(conn, key=(job_id, int(batch_id)))
            return None if prior is None else txn_results(conn, prior, {})

    def commit_guarded(
        self,
        changes: Sequence[TableChange],
        *,
        guard: "Guard | None" = None,
        after: "After | None" = None,
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
        return commit(self.backend, changes, retries=self.commit_retries, guard=guard, after=after,
                      job_id=job_id, batch_id=batch_id, clock=self.clock)
