"""The table handle below :class:`~lakestep.catalog.table.Table`: what the write,
key, cleanup and lifecycle helpers need of a table, and nothing of its user API.

A :class:`TableHandle` holds a table's metadata (:class:`TableMeta`), reads its
head (version, data version), the files live at a version, and the rows stored
in files (physical, with tombstones, or merged); :attr:`TableHandle.writer`
gives full paths and writes files. :class:`~lakestep.catalog.table.Table` is
the user-facing object built on it (reads with time travel, one-commit writes,
snapshots and locks); its read plan (:class:`~lakestep.catalog.plan.ReadPlan`)
is the public read face for readers without the catalog database.

The helpers (``writes.py``, ``pk.py``, ``cleanup.py``, ``lifecycle.py``) take a
handle, so none of them imports ``table.py`` or ``catalog.py``: the catalog is
seen through :class:`CatalogLike`.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Protocol, Sequence

import pyarrow as pa
import sqlalchemy as sa

from ..errors import TableNotFoundError
from . import pk, reader
from . import properties as P
from . import schema as S
from .changes import FILE_COLS, row_to_file
from .columns import ColumnIds
from .files import DataFile
from .predicates import Predicate, Verdict
from .storage import Storage
from .writer import FileWriter

if TYPE_CHECKING:
    from ..clock import Clock
    from .backend import Backend
    from .locations import Deletions


class CatalogLike(Protocol):
    """What a table handle and its helpers use of :class:`~lakestep.catalog.catalog.Catalog`."""

    backend: "Backend"
    clock: "Clock"
    storage: "Storage"  # how files are reached (object-store options)

    def deletion_guard(self, table: "TableHandle", *, dropped: bool = False) -> "Deletions": ...


class Head(NamedTuple):
    """What :meth:`TableHandle.head` reads: the newest version, data version and schema id."""

    version: int
    data_version: int
    schema_id: int


@dataclass(frozen=True)
class TableMeta:
    table_id: int
    namespace: str
    name: str
    location: str
    external: bool
    schema: pa.Schema
    partition_by: list[str]
    primary_key: list[str]
    properties: dict[str, str]
    created_at: float
    schema_id: int = 0
    column_ids: ColumnIds | None = None  # columns.py; None only before the catalog's upgrade ran

    @classmethod
    def from_row(cls, r: Mapping[str, Any] | sa.RowMapping) -> "TableMeta":
        return cls(
            table_id=r["table_id"],
            namespace=r["namespace"],
            name=r["name"],
            location=r["location"],
            external=bool(r["external"]),
            schema=pa.ipc.read_schema(pa.py_buffer(r["schema_ipc"])),
            partition_by=json.loads(r["partition_by"]),
            primary_key=json.loads(r["primary_key"]),
            properties=json.loads(r["properties"]),
            created_at=r["created_at"],
            schema_id=int(r.get("schema_id") or 0),
            column_ids=ColumnIds.from_json(r.get("column_ids"), int(r.get("last_column_id") or 0)),
        )



class TableHandle:
    """A table's metadata, head, files and stored rows (see the module docstring)."""

    def __init__(self, catalog: "CatalogLike", meta: TableMeta) -> None:
        self.catalog = catalog
        self.meta = meta
        self._live: dict[int, DataFile] | None = None  # live files at _live_version (see _live_at_head)
        self._live_version = -1
        self._live_lock = threading.Lock()
        self.warned: set[tuple[str, str]] = set()  # invalid stored properties already logged

    # ---------------------------------------------------------------- metadata
    @property
    def ident(self) -> str:
        return f"{self.meta.namespace}.{self.meta.name}"

    @property
    def table_id(self) -> int:
        return self.meta.table_id

    @property
    def schema(self) -> pa.Schema:
        return self.meta.schema

    @property
    def partition_by(self) -> list[str]:
        return self.meta.partition_by

    @property
    def primary_key(self) -> list[str]:
        return self.meta.primary_key

    @property
    def properties(self) -> dict[str, str]:
        return self.meta.properties

    @property
    def location(self) -> str:
        return self.meta.location

    @property
    def retention_seconds(self) -> float:
        """``lakestep.retention-seconds`` (7 days if unset; the default, logged, if invalid)."""
        return float(P.value(self.ident, self.properties, P.RETENTION, warned=self.warned))

    # ------------------------------------------------------------ head, files, rows
    @cached_property
    def writer(self) -> FileWriter:
        return FileWriter(self.location, self.catalog.storage, column_ids=self.meta.column_ids,
                          schema=self.meta.schema)

    def head(self, conn: sa.Connection) -> "Head":
        """The table's head: its version, data version and schema id (a handle whose schema is
        older than the head's reads with the head's, table_reads.py)."""
        row = conn.execute(
            sa.select(S.tables.c.version, S.tables.c.data_version, S.tables.c.schema_id)
            .where(S.tables.c.table_id == self.table_id)
        ).first()
        if row is None:
            raise TableNotFoundError(self.ident)
        return Head(int(row.version), int(row.data_version), int(row.schema_id))

    def files_at(self, conn: sa.Connection, v: int, head: int,
                 partitions: frozenset[str] | None = None) -> list[DataFile]:
        """The files live at version ``v``; with ``partitions`` (stored partition keys),
        only those of these partitions, found through the partition index without
        listing the others (and without the head cache)."""
        f = S.files.c
        if partitions is not None:
            out: list[DataFile] = []
            keys = sorted(partitions)
            for i in range(0, len(keys), 500):
                q = sa.select(*FILE_COLS).where(
                    f.table_id == self.table_id, f.partition.in_(keys[i:i + 500]), f.added_version <= v,
                    sa.or_(f.removed_version.is_(None), f.removed_version > v))
                out.extend(row_to_file(r) for r in conn.execute(q).all())
            return sorted(out, key=lambda d: d.file_id)
        if v == head:
            return self._live_at_head(conn, head)
        q = sa.select(*FILE_COLS).where(
            f.table_id == self.table_id, f.added_version <= v,
            sa.or_(f.removed_version.is_(None), f.removed_version > v))
        return [row_to_file(r) for r in conn.execute(q.order_by(f.file_id)).all()]

    def _live_at_head(self, conn: sa.Connection, head: int) -> list[DataFile]:
        """The live files at ``head``, kept per handle and brought up to date incrementally.

        The first call lists every live file; later calls read only the files
        added or removed by the commits since (usually none or a few), like a
        Delta or Iceberg client replaying new log entries onto its state.
        """
        f = S.files.c
        with self._live_lock:
            cached, at = self._live, self._live_version
            # Cleanup prunes the rows of files removed before its floor, and the commit
            # rows below it: if ``at`` lost its commit row, the delta may miss removals.
            stale = cached is not None and head > at and conn.execute(
                sa.select(S.commits.c.version).where(
                    S.commits.c.table_id == self.table_id, S.commits.c.version == at)).first() is None
            if cached is None or stale or head < at or head - at > 1000:
                q = sa.select(*FILE_COLS).where(
                    f.table_id == self.table_id, f.added_version <= head, f.removed_version.is_(None))
                cached = {d.file_id: d for d in map(row_to_file, conn.execute(q.order_by(f.file_id)).all())}
            elif head > at:
                cached = dict(cached)
                gone = conn.execute(sa.select(f.file_id).where(
                    f.table_id == self.table_id, f.removed_version > at, f.removed_version <= head)).scalars().all()
                for fid in gone:
                    cached.pop(fid, None)
                q = sa.select(*FILE_COLS).where(
                    f.table_id == self.table_id, f.added_version > at, f.added_version <= head,
                    sa.or_(f.removed_version.is_(None), f.removed_version > head))
                for r in conn.execute(q.order_by(f.file_id)).all():
                    cached[r.file_id] = row_to_file(r)
            if head >= at:
                self._live, self._live_version = cached, head
            return list(cached.values())

    def head_and_live(self) -> tuple[int, int, list[DataFile]]:
        """(version, data version, live files) at the head, read consistently."""
        with self.catalog.backend.read() as conn:
            h = self.head(conn)
            return h.version, h.data_version, self.files_at(conn, h.version, head=h.version)

    @cached_property
    def physical_schema(self) -> pa.Schema:
        """The schema of the data files: the table's, plus a tombstone flag on primary-key tables."""
        return pk.physical_schema(self.schema, self.primary_key) if self.primary_key else self.schema

    def physical(self, data: pa.Table) -> pa.Table:
        """Conformed rows -> rows as written to files."""
        return pk.to_physical(self, data) if self.primary_key else data

    def read_physical(self, files: Sequence[DataFile]) -> pa.Table:
        """The rows stored in ``files``, as stored (tombstones included), checked (reader.py)."""
        return reader.read(self.ident, self.writer, files, self.physical_schema)

    def read_files(
        self, files: list[DataFile], *, columns: Sequence[str] | None = None, where: Predicate | None = None
    ) -> pa.Table:
        """The logical rows ``files`` make up (merged on read for primary-key tables),
        files pruned by ``where`` where that is safe."""
        if where is not None and not self.primary_key:  # (pk.read prunes what is safe to prune)
            files = [f for f in files if where.verdict(f) is not Verdict.NONE]
        if self.primary_key:
            return pk.read(self, files, columns=columns, where=where)
        return reader.read(self.ident, self.writer, files, self.schema, columns=columns,
                           filter=where.file_expression() if where is not None else None)

    def read_head(self, *, columns: Sequence[str] | None = None, where: Predicate | None = None) -> pa.Table:
        """The logical rows at the newest version (``Table.to_arrow()`` without time travel)."""
        return self.read_files(self.head_and_live()[2], columns=columns, where=where)

    def _set_meta(self, meta: TableMeta) -> None:
        self.meta = meta
        self.__dict__.pop("physical_schema", None)  # derived from the schema
        self.__dict__.pop("writer", None)  # its ids and stored names are the schema's

