"""The user-facing table: reads with time travel, one-commit writes, snapshots and locks,
built on the :class:`~lakestep.catalog.handle.TableHandle` the helpers take (handle.py)."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, ContextManager, Mapping, Protocol, Sequence

import pyarrow as pa
import sqlalchemy as sa

from ..errors import (
    InvalidArgumentError,
    LakestepError,
    NoPrimaryKeyError,
    SchemaChangedConflict,
    SchemaChangeError,
    TableNotFoundError,
)
from . import alter, lifecycle, table_reads
from . import cleanup as cleanup_mod
from . import properties as P
from . import schema as S
from .changes import CommitResult, Isolation, Operation
from .checks import check_barrier, check_seconds
from .columns import widening
from .files import DataFile
from .handle import CatalogLike, Head, TableHandle, TableMeta
from .predicates import Filter, Predicate
from .writes import PartitionSpec

if TYPE_CHECKING:
    from .plan import ReadPlan
    from .table_reads import CommitInfo

DEFAULT_RETENTION_SECONDS = P.DEFAULT_RETENTION_SECONDS
log = logging.getLogger(__name__)
#: The writes that add files to a primary-key table (``Table._compact_on_write``).
_ADDS_KEYED_FILES = frozenset({"append", "delete", "update"})


class TableCatalog(CatalogLike, Protocol):
    """What a :class:`Table` uses of :class:`~lakestep.catalog.catalog.Catalog`: a handle's
    needs, and transactions for its one-commit writes."""

    pk_writes: dict[int, int]

    def transaction(self, *, job_id: str | None = None, batch_id: int | None = None) -> ContextManager[Any]: ...


class Table(TableHandle):
    """A lakestep table. Get one from :meth:`Catalog.create_table` or :meth:`Catalog.load_table`.

    Every write method is one commit (use :meth:`Catalog.transaction` to commit
    several tables at once). Every read takes ``version=``, ``data_version=``
    or ``as_of=`` (a timestamp: the last commit at or before it) for time travel.

    Example::

        t = catalog.load_table("shop.orders")
        t.append(pa.table({"id": [1, 2], "amount": [9.5, 3.0]}))
        t.delete([("id", "=", 2)])
        t.to_arrow(version=1)      # the table as it was after the first commit
    """

    catalog: TableCatalog

    def __repr__(self) -> str:
        return f"Table({self.ident!r}, location={self.location!r})"

    def set_properties(self, updates: Mapping[str, Any] | None = None, *,
                       remove: Sequence[str] = ()) -> "Table":
        """Set and remove table properties in one change; returns this handle.

        The resulting properties are validated as at create (``properties.py``):
        an unknown ``lakestep.*`` key or a bad value raises
        :class:`InvalidPropertyError` and changes nothing.

        Example::

            t.set_properties({"lakestep.retention-seconds": "86400"})
        """
        gone = {remove} if isinstance(remove, str) else set(remove)
        t = S.tables
        with self.catalog.backend.write() as conn:
            row = self._locked_row(conn)
            current = TableMeta.from_row(row)
            props = {k: v for k, v in current.properties.items() if k not in gone}
            props.update({str(k): str(v) for k, v in (updates or {}).items()})
            props = P.validate(props, current.schema)
            conn.execute(sa.update(t).where(t.c.table_id == self.table_id).values(properties=json.dumps(props)))
            row = conn.execute(t.select().where(t.c.table_id == self.table_id)).mappings().one()
        self._set_meta(TableMeta.from_row(row))
        log.info("%s: properties now %s", self.ident, props)
        return self

    # ------------------------------------------------------------------ schema
    def add_columns(self, *fields: "pa.Field | tuple[str, pa.DataType]") -> "Table":
        """Add nullable columns at the end of the schema, or fields at the end of a struct
        column (a dotted name, ``"s.y"``); returns this handle.

        No file is rewritten: rows written before read null in the new
        columns, at every version. The change is one ``ALTER`` commit in
        :meth:`history` (its summary names the columns and their new ids). A column that exists with the same type is
        kept (so the call is idempotent); one that exists with another type
        raises :class:`SchemaMismatchError`. Writers holding an older handle
        may still append and upsert (their rows get nulls), but their
        rewrites (delete, update, overwrite, compaction) fail with
        :class:`SchemaChangedConflict` until they reload the table, so no
        new column's values are lost. A new column never reads the values of a
        column dropped before under the same name (alter.py rule 3).

        Example::

            t.add_columns(pa.field("coupon", pa.string()))
            t.add_columns(("address.zip", pa.string()))
        """
        new = [f if isinstance(f, pa.Field) else pa.field(*f) for f in fields]
        return self._schema_change(lambda conn, meta: alter.add(meta, new, self._history(conn)))

    def rename_column(self, name: str, new_name: str) -> "Table":
        """Rename a column (or a struct column's field: ``"s.x"``): one ``ALTER`` commit,
        metadata only; returns this handle.

        The column keeps its id and the name its values are stored under, so every
        reader returns the new name over files written before (and time travel to a
        version before the rename shows the old one). Primary-key and partition columns
        may be renamed: the key and the partitioning follow. Writers holding the schema
        from before the rename still write the column's values to it (matched by id);
        their rewrites fail with :class:`SchemaChangedConflict` until they reload.
        Refused (:class:`SchemaChangeError`): no such column, a name in use, a
        reserved (``_ls_``) or invalid name.

        Example::

            t.rename_column("amout", "amount")
        """
        return self._schema_change(lambda conn, meta: alter.rename(meta, name, new_name))

    def drop_column(self, name: str) -> "Table":
        """Drop a column (or a struct column's field: ``"s.x"``): one ``ALTER`` commit,
        metadata only; returns this handle.

        Reads no longer return it (time travel to a version before the drop still
        does); its values stay in the files until they are rewritten. A writer
        holding the schema from before the drop may still append: its values for the
        column are discarded, with a warning at commit (docs/design.md §2). Refused
        (:class:`SchemaChangeError`): a primary-key or partition column, the table's
        or a struct's last column, no such column.

        Example::

            t.drop_column("legacy_flag")
        """
        return self._schema_change(lambda conn, meta: alter.drop(meta, name))

    def _schema_change(self, make: Any) -> "Table":
        """Run one of alter.py's changes under the table row's lock and commit it."""
        with self.catalog.backend.write() as conn:
            row = self._locked_row(conn)
            meta = TableMeta.from_row(row)
            got = make(conn, meta)
            if got is not None:
                row = self._alter(conn, row, got.schema, got.change, **got.values())
        self._set_meta(TableMeta.from_row(row))
        if got is not None:
            log.info("%s: %s (version %d, schema %d)", self.ident, got.change, int(row["version"]),
                     self.meta.schema_id)
        return self

    def _history(self, conn: sa.Connection) -> list[pa.Schema]:
        """Every schema the table had (ls_schema)."""
        rows = conn.execute(sa.select(S.schemas.c.schema_ipc).where(S.schemas.c.table_id == self.table_id))
        return [pa.ipc.read_schema(pa.py_buffer(r[0])) for r in rows]

    def update_column(self, name: str, type: pa.DataType | None = None, *, nullable: bool | None = None) -> "Table":
        """Widen a column's type or make a required column optional: one catalog commit,
        metadata only (no file is rewritten); returns this handle.

        ``type``: a safe widening (columns.py :func:`widening`: a wider signed integer,
        float to double, a decimal with more digits and the same scale); anything else
        raises :class:`SchemaChangeError`. ``nullable=True``: the column takes nulls from
        now on (a primary-key column cannot). Files written before read as the new type.
        The change is a commit of its own (operation ``ALTER``, its ``summary`` says what
        changed) in :meth:`history`. Writers holding an older handle may still append
        (their rows are written with the old type and read as the new one); their
        rewrites fail with :class:`SchemaChangedConflict` until they reload the table.

        Example::

            t.update_column("n", pa.int64())          # or type=pa.int64()
            t.update_column("note", nullable=True)
        """
        if type is None and nullable is None:
            raise InvalidArgumentError("update_column needs type= or nullable=", argument="type", value=None)
        if nullable is False:
            raise SchemaChangeError(self.ident, name, "a column cannot be made required (rows written before may "
                                    "hold nulls)")
        with self.catalog.backend.write() as conn:
            row = self._locked_row(conn)
            meta = TableMeta.from_row(row)
            current = meta.schema
            i = current.get_field_index(name)
            if i < 0:
                raise SchemaChangeError(self.ident, name, f"no such column (columns: {current.names})")
            old = current.field(i)
            new = old
            change: dict[str, Any] = {"change": "update_column", "column": name}
            if type is not None and not old.type.equals(type):  # (its type already: nothing to change)
                why = widening(old.type, type)
                if why is not None:
                    raise SchemaChangeError(self.ident, name, why)
                new = new.with_type(type)
                change.update({"from_type": str(old.type), "to_type": str(type)})
            if nullable:
                if name in meta.primary_key:
                    raise SchemaChangeError(self.ident, name, "a primary-key column cannot take nulls")
                if not old.nullable:
                    new = new.with_nullable(True)
                    change.update({"nullable": True})
            if new.equals(old, check_metadata=True):  # nothing to change (an idempotent call)
                self._set_meta(meta)
                return self
            row = self._alter(conn, row, current.set(i, new), change)
        self._set_meta(TableMeta.from_row(row))
        log.info("%s: %s (version %d)", self.ident, change, int(row["version"]))
        return self

    def reorder_columns(self, names: Sequence[str]) -> "Table":
        """Put the columns in the order ``names`` gives (every column once): one ``ALTER``
        commit, metadata only; returns this handle. Reads return the new order (files are
        read by name); writers may give columns in any order, as before. A call with the
        current order commits nothing. Refused (:class:`SchemaChangeError`): a name that is
        not a column, a column left out or named twice.

        Example::

            t.reorder_columns(["id", "day", "amount"])
        """
        names = list(names)
        with self.catalog.backend.write() as conn:
            row = self._locked_row(conn)
            meta = TableMeta.from_row(row)
            current = meta.schema
            unknown = [n for n in names if current.get_field_index(n) < 0]
            if unknown:
                raise SchemaChangeError(self.ident, unknown[0], f"no such column (columns: {current.names})")
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise SchemaChangeError(self.ident, twice[0], "named more than once")
            missing = [n for n in current.names if n not in names]
            if missing:
                raise SchemaChangeError(self.ident, missing[0], "left out: name every column once")
            if names == current.names:
                self._set_meta(meta)
                return self
            schema = pa.schema([current.field(n) for n in names], metadata=current.metadata)
            row = self._alter(conn, row, schema, {"change": "reorder_columns", "from": current.names, "to": names})
        self._set_meta(TableMeta.from_row(row))
        log.info("%s: columns reordered to %s (version %d)", self.ident, names, int(row["version"]))
        return self

    def _locked_row(self, conn: sa.Connection) -> Any:
        """The table's row, locked in ``conn``'s write transaction for a change of it."""
        t = S.tables
        row = conn.execute(t.select().where(t.c.table_id == self.table_id).with_for_update()).mappings().first()
        if row is None:
            raise TableNotFoundError(self.ident)
        return row

    def _alter(self, conn: sa.Connection, row: Any, schema: pa.Schema, change: dict[str, Any], **values: Any) -> Any:
        """A schema change's commit, in the caller's write transaction holding the table row's
        lock (:meth:`_locked_row`): the new schema (``schema_id`` + 1: older writers' rewrites are
        refused), and an ``ALTER`` commit of no files whose summary is ``change``. Returns the
        table's row as it is now."""
        t = S.tables
        head_v, head_dv = int(row["version"]), int(row["data_version"])
        now = self.catalog.clock.now()
        conn.execute(sa.update(t).where(t.c.table_id == self.table_id).values(
            schema_ipc=schema.serialize().to_pybytes(), schema_id=t.c.schema_id + 1, version=head_v + 1,
            last_commit_at=now, stamp=S.NextStamp(), **values))
        conn.execute(sa.insert(S.commits).values(
            table_id=self.table_id, version=head_v + 1, data_version=head_dv, operation=Operation.ALTER.value,
            base_version=head_v, committed_at=now, summary=json.dumps(change, separators=(",", ":"))))
        S.record_schema(conn, self.table_id, head_v + 1)
        return conn.execute(t.select().where(t.c.table_id == self.table_id)).mappings().one()

    def refresh(self) -> "Table":
        """Re-read the table's metadata (schema, properties) from the catalog; returns this handle."""
        t = S.tables
        with self.catalog.backend.read() as conn:
            row = conn.execute(t.select().where(t.c.table_id == self.table_id)).mappings().first()
        if row is None:
            raise TableNotFoundError(self.ident)
        self._set_meta(TableMeta.from_row(row))
        return self

    @property
    def version(self) -> int:
        """The newest version (every commit adds one)."""
        with self.catalog.backend.read() as conn:
            return self.head(conn)[0]

    @property
    def data_version(self) -> int:
        """The newest data version (commits that change rows add one; compactions do not)."""
        with self.catalog.backend.read() as conn:
            return self.head(conn)[1]

    # ------------------------------------------------------------------- reads
    def files(
        self, *, version: int | None = None, data_version: int | None = None, as_of: Any = None,
        snapshot: str | None = None,
    ) -> list[DataFile]:
        """The live data files at the newest version, or at the one asked for."""
        return self.scan_files(version=version, data_version=data_version, as_of=as_of, snapshot=snapshot)[1]

    def scan_files(
        self, *, version: int | None = None, data_version: int | None = None, as_of: Any = None,
        snapshot: str | None = None,
    ) -> tuple[int, list[DataFile]]:
        """(version, live files) read consistently."""
        with self.catalog.backend.read() as conn:
            v, h = table_reads.resolve(self, conn, version, data_version, as_of, snapshot)
            return v, table_reads.files_for(self, conn, v, h.version, None)

    def added_files(self, from_data_version: int, to_data_version: int) -> list[DataFile]:
        """The files whose rows a stream of this table emits for the data versions
        ``(from_data_version, to_data_version]``, oldest first.

        Appends and upserts emit their files; an overwrite emits its new rows (not
        the rows it kept by rewriting). Compactions have no data version, and the
        rewrites of copy-on-write deletes and updates are not emitted: the stream
        is the table's appended and upserted rows.
        """
        return table_reads.added_files(self, from_data_version, to_data_version)

    def to_arrow(
        self,
        *,
        version: int | None = None,
        data_version: int | None = None,
        as_of: Any = None,
        snapshot: str | None = None,
        columns: Sequence[str] | None = None,
        where: Filter | Predicate | None = None,
    ) -> pa.Table:
        """The rows at the newest version or the one asked for, as an Arrow table, with the
        schema of that version (columns.py rule 7)."""
        with self.catalog.backend.read() as conn:
            v, h = table_reads.resolve(self, conn, version, data_version, as_of, snapshot)
            at = self._as_of_schema(conn, v, h)
            pred = Predicate.parse(where, at.schema) if where is not None else None
            live = table_reads.files_for(at, conn, v, h.version, pred)
        return at.read_files(live, columns=columns, where=pred)

    def _as_of_schema(self, conn: sa.Connection, v: int, head: Head) -> "Table":
        """This table as version ``v`` saw it (table_reads.py :func:`as_of_schema`)."""
        return table_reads.as_of_schema(self, conn, v, head, Table)

    def read_plan(
        self,
        *,
        version: int | None = None,
        data_version: int | None = None,
        as_of: Any = None,
        snapshot: str | None = None,
        where: Filter | Predicate | None = None,
    ) -> "ReadPlan":
        """A self-contained plan to read this table at one version (plan.py): absolute
        file URIs, schema, key, merge order. Readers (Spark executors, DuckDB) use it
        without the catalog database. ``where`` prunes files by their statistics; when it
        pins every partition column (``=``, ``in``, ``is_null``), only the files of those
        partitions are listed at all (an indexed lookup: the cost follows the partitions
        read, not the table's size)."""
        with self.catalog.backend.read() as conn:
            return self.plan_within(conn, version=version, data_version=data_version, as_of=as_of,
                                    snapshot=snapshot, where=where, prune=True)

    def plan_within(self, conn: sa.Connection, *, version: int | None = None, data_version: int | None = None,
                    as_of: Any = None, snapshot: str | None = None,
                    where: Filter | Predicate | None = None, prune: bool = False) -> "ReadPlan":
        """:meth:`read_plan` inside a read transaction the caller holds (``backend.read()``),
        so that plans of several tables cost one transaction (a consistent multi-table read).
        ``where`` narrows the listing to the partitions it pins; with ``prune`` it also drops
        the files its statistics rule out (as :meth:`ReadPlan.prune`, before the plan's
        files are built: a selective filter pays for the files it keeps). The plan has the
        schema of the version it reads (columns.py rule 7)."""
        v, h = table_reads.resolve(self, conn, version, data_version, as_of, snapshot)
        return table_reads.plan_at(self._as_of_schema(conn, v, h), conn, v, h.version, where, prune)

    def count(self, *, version: int | None = None, data_version: int | None = None, as_of: Any = None,
              snapshot: str | None = None) -> int:
        """Row count (from metadata alone, except on primary-key tables, which are merged)."""
        if self.primary_key:
            return self.to_arrow(version=version, data_version=data_version, as_of=as_of, snapshot=snapshot,
                                 columns=self.primary_key).num_rows
        return sum(f.record_count for f in self.files(version=version, data_version=data_version, as_of=as_of,
                                                      snapshot=snapshot))

    def recorded_paths(self, paths: Sequence[str]) -> set[str]:
        """The ``paths`` (relative to the table's location) that some commit of this table
        recorded, live or removed since: files a writer must not delete."""
        return table_reads.recorded_paths(self, paths)

    def history(self, *, limit: int | None = None) -> list[CommitInfo]:
        """Commits, newest first (version 0 is the table's creation)."""
        return table_reads.history(self, limit=limit)

    # ------------------------------------------------------------------ writes
    def _one(self, method: str, *args: Any, job_id: str | None = None, batch_id: int | None = None,
             **kwargs: Any) -> CommitResult:
        try:
            with self.catalog.transaction(job_id=job_id, batch_id=batch_id) as tx:
                getattr(tx, method)(self, *args, **kwargs)
        except SchemaChangedConflict:
            self.refresh()  # a retry with this handle reads with the new schema
            raise
        if self.primary_key and method in _ADDS_KEYED_FILES:
            self._compact_on_write()
        return tx.results[0]

    def _compact_on_write(self) -> None:
        """Compaction on write of a primary-key table (``lakestep.pk.compaction-trigger``: n,
        default 8; 0 off):

        1. Every n-th write (upsert, delete, update) of the table through this catalog
           object (``Catalog.pk_writes``; the write itself reads nothing) looks at the
           table's live files: in each partition, the newest files of similar size, when
           there are at least n, are merged into one (``writes._newest_runs``), sorted by
           key, tombstones kept: a COMPACT commit, no new data version.
        2. It runs after the write's commit: the write is done whatever happens to it. A
           compaction that loses a race is discarded, as any; one that fails is logged
           (warning) and left to the next one or to maintenance, never raised.

        Not guaranteed: writers through other catalog objects (other processes) count
        their own writes, so a table written by many may be looked at more often; the
        streaming sinks commit through transactions and leave compaction to maintenance.
        """
        trigger = int(P.value(self.ident, self.properties, P.PK_COMPACTION_TRIGGER, warned=self.warned))
        if trigger < 2:
            return
        n = self.catalog.pk_writes.get(self.table_id, 0) + 1
        self.catalog.pk_writes[self.table_id] = n % trigger
        if n < trigger:
            return
        try:
            with self.catalog.transaction() as tx:
                tx.compact(self, runs=trigger)
        except LakestepError as e:  # a dead database too: the write is committed, not this
            log.warning("compaction on write of %s failed (left to the next one): %s", self.ident, e)

    def append(self, data: Any, *, job_id: str | None = None, batch_id: int | None = None,
               barrier: int | None = None) -> CommitResult:
        """Add rows. Blind appends never conflict. On a primary-key table this is an upsert."""
        return self._one("append", data, job_id=job_id, batch_id=batch_id, barrier=barrier)

    def upsert(self, data: Any, *, job_id: str | None = None, batch_id: int | None = None,
               barrier: int | None = None) -> CommitResult:
        """Insert or replace rows by primary key (a MERGE commit of the changed rows only).

        Readers see the newest row per key in commit order; within ``data`` the
        last row of a key wins. Upserts never conflict.
        """
        if not self.primary_key:
            raise NoPrimaryKeyError(self.ident)
        return self._one("append", data, job_id=job_id, batch_id=batch_id, barrier=barrier)

    def overwrite(
        self,
        data: Any,
        *,
        partitions: PartitionSpec = None,
        where: Filter | Predicate | None = None,
        job_id: str | None = None,
        batch_id: int | None = None,
        barrier: int | None = None,
    ) -> CommitResult:
        """Replace everything live in a range with ``data`` (empty ``data`` empties the range).

        The range is the whole table (default), ``partitions=[{"day": ...}, ...]``,
        ``partitions="dynamic"`` (the partitions present in ``data``), or a
        predicate ``where=``. Rows that land concurrently in the range are
        replaced too: the overwrite wins.
        """
        return self._one("overwrite", data, partitions=partitions, where=where,
                         job_id=job_id, batch_id=batch_id, barrier=barrier)

    def delete(self, where: Filter | Predicate, *, isolation: Isolation | None = None,
               job_id: str | None = None, batch_id: int | None = None) -> CommitResult:
        """Delete the rows matching ``where`` (copy-on-write)."""
        return self._one("delete", where, isolation=isolation, job_id=job_id, batch_id=batch_id)

    def update(self, set: Mapping[str, Any], where: Filter | Predicate, *, isolation: Isolation | None = None,
               job_id: str | None = None, batch_id: int | None = None) -> CommitResult:
        """Set columns of the rows matching ``where`` to literals or pyarrow expressions."""
        return self._one("update", set, where, isolation=isolation, job_id=job_id, batch_id=batch_id)

    def compact(self, *, target_file_size: int = 128 << 20, min_files: int = 2, major: bool = False) -> CommitResult:
        """Merge small files; creates a version but no data version. May be discarded by a
        concurrent commit that removed its inputs (``result.discarded``). With nothing to
        merge it commits nothing (``result.summary["noop"]``).

        Minor (default): small files are merged. Major: every file of a partition
        is rewritten; on a primary-key table into the resolved rows (one per
        key, no tombstones), so reads need no merging."""
        return self._one("compact", target_file_size=target_file_size, min_files=min_files, major=major)

    def restore(self, version: int, *, barrier: int | None = None) -> CommitResult:
        """Make the table hold exactly the rows of ``version`` again: a new commit, history kept.

        Metadata only: files live now but not then are removed, files live then
        are recorded again (refused past the retention window unless a snapshot
        or a version lock kept them).

        Example::

            t.restore(3)
            assert t.to_arrow().equals(t.to_arrow(version=3))
        """
        return self._one("restore", version, barrier=barrier)

    # --------------------------------------------------------- snapshots, locks
    def create_snapshot(self, name: str, *, version: int | None = None, barrier: int | None = None,
                        retain_seconds: float | None = None, exist_ok: bool = False) -> lifecycle.Snapshot:
        """Name a version (default: the newest) so that it stays readable and its files kept."""
        if barrier is not None:
            check_barrier(barrier)
        if retain_seconds is not None:
            check_seconds(retain_seconds, "retain_seconds")
        return lifecycle.create_snapshot(self, name, version=version, barrier=barrier,
                                         retain_seconds=retain_seconds, exist_ok=exist_ok)

    def snapshots(self) -> list[lifecycle.Snapshot]:
        return lifecycle.list_snapshots(self)

    def drop_snapshot(self, name: str) -> None:
        lifecycle.drop_snapshot(self, name)

    def expire_snapshots(self, *, keep_last: int | None = None, older_than: float | None = None) -> int:
        return lifecycle.expire_snapshots(self, keep_last=keep_last, older_than=older_than)

    def lock(self, *, locker: str, version: int | None = None, kind: str = "read",
             lease_seconds: float | None = 300.0) -> lifecycle.VersionLock:
        """Pin a version (default: the newest) for a reader; see :class:`VersionLock`.

        Example::

            with table.lock(locker="report-42", lease_seconds=600) as pin:
                rows = table.to_arrow(version=pin.version)   # stays readable meanwhile
        """
        if lease_seconds is not None:
            check_seconds(lease_seconds, "lease_seconds")
        return lifecycle.lock_version(self, locker=locker, version=version, kind=kind, lease_seconds=lease_seconds)

    # ------------------------------------------------------------- maintenance
    def rewrite_file(self, file: DataFile | int, transform: Any, *, job_id: str | None = None,
                     batch_id: int | None = None) -> CommitResult:
        """Replace one data file by ``transform(rows)`` without touching any other file.

        For segment rewrites: drop a column's values from one file, delete one
        row for a privacy request. Commits like an UPDATE of that file's rows.
        """
        return self._one("rewrite_file", file, transform, job_id=job_id, batch_id=batch_id)

    def cleanup(self, *, retention_seconds: float | None = None, dry_run: bool = False,
                orphans: bool = True, force: bool = False) -> "cleanup_mod.CleanupReport":
        """Delete files no retained version needs, and orphans; prune expired metadata.

        ``retention_seconds`` defaults to the table's ``lakestep.retention-seconds``
        (7 days). A shorter window is refused unless ``force=True``: readers
        without a version lock, and the commit protocol's undo of compactions,
        count on the table's window. ``dry_run=True`` only reports what would
        go and how many bytes.
        """
        if retention_seconds is not None:
            retention_seconds = check_seconds(retention_seconds, "retention_seconds")
        if retention_seconds is not None and retention_seconds < self.retention_seconds and not force:
            raise InvalidArgumentError(
                f"cleanup window {retention_seconds}s is shorter than {self.ident}'s retention "
                f"({self.retention_seconds}s, property lakestep.retention-seconds): readers and compaction undo "
                "rely on it; lower the property, or pass force=True",
                argument="retention_seconds", value=retention_seconds)
        return cleanup_mod.cleanup(self, retention_seconds=retention_seconds, dry_run=dry_run, orphans=orphans)
