"""The read side of :class:`~lakestep.catalog.table.Table`: the version a read asks for
(``version=``, ``data_version=``, ``as_of=``, ``snapshot=``), the files live at it, the
schema it had, its self-contained read plan (plan.py), the paths commits recorded, and the
table's history (:class:`CommitInfo`). The functions take the table's handle (handle.py), so
this module does not import ``table.py``; the ``Table`` read methods delegate to them."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

import pyarrow as pa
import sqlalchemy as sa

from ..errors import InvalidArgumentError, TableNotFoundError, VersionNotFoundError
from . import lifecycle
from . import schema as S
from .changes import FILE_COLS, row_to_file
from .files import DataFile
from .handle import CatalogLike, Head, TableHandle, TableMeta
from .predicates import Filter, Predicate, Verdict
from .storage import file_uri

if TYPE_CHECKING:
    from .plan import ReadPlan

H = TypeVar("H", bound=TableHandle)


@dataclass(frozen=True)
class CommitInfo:
    """One entry of a table's history."""

    version: int
    data_version: int
    operation: str
    base_version: int
    committed_at: float
    barrier: int | None
    added_files: int
    removed_files: int
    added_rows: int
    removed_rows: int
    job_id: str | None
    batch_id: int | None
    summary: dict[str, Any]

    @property
    def timestamp(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.committed_at, tz=dt.timezone.utc)


def resolve(
    table: TableHandle, conn: sa.Connection, version: int | None, data_version: int | None, as_of: Any,
    snapshot: str | None = None,
) -> tuple[int, Head]:
    """(the version asked for, the head)."""
    given = sum(x is not None for x in (version, data_version, as_of, snapshot))
    if given > 1:
        raise InvalidArgumentError("pass at most one of version=, data_version=, as_of=, snapshot=",
                                   argument="version", value=(version, data_version, as_of, snapshot))
    h = table.head(conn)
    head, head_dv = h.version, h.data_version
    c = S.commits.c
    if snapshot is not None:
        return lifecycle.snapshot_version(table, conn, snapshot), h
    if version is not None:
        if not 0 <= version <= head:
            raise VersionNotFoundError(table.ident, f"version {version} (newest is {head})")
        if version < head and conn.execute(sa.select(c.version).where(
                c.table_id == table.table_id, c.version == version)).first() is None:
            raise VersionNotFoundError(table.ident, f"version {version} any more (expired and cleaned up)")
        return int(version), h
    if data_version is not None:
        if not 0 <= data_version <= head_dv:
            raise VersionNotFoundError(table.ident, f"data version {data_version} (newest is {head_dv})")
        row = conn.execute(
            sa.select(sa.func.max(c.version)).where(c.table_id == table.table_id, c.data_version == data_version)
        ).scalar()
        if row is None:
            raise VersionNotFoundError(table.ident, f"data version {data_version}")
        return int(row), h
    if as_of is not None:
        ts = as_of.timestamp() if isinstance(as_of, dt.datetime) else float(as_of)
        row = conn.execute(
            sa.select(sa.func.max(c.version)).where(c.table_id == table.table_id, c.committed_at <= ts)
        ).scalar()
        if row is None:
            raise VersionNotFoundError(table.ident, f"commit at or before {as_of!r}")
        return int(row), h
    return head, h


def files_for(table: TableHandle, conn: sa.Connection, v: int, head: int, pred: Predicate | None, *,
              by_stats: bool = True) -> list[DataFile]:
    """The files live at ``v`` that may hold rows matching ``pred`` (a superset: callers
    still judge each by its statistics). Narrowed through the partition index when
    ``pred`` pins every partition column, else (``by_stats``) through the typed
    statistics rows (stats_sql.py) when every clause bounds a column SQL compares
    exactly; else every live file."""
    if pred is None:
        return table.files_at(conn, v, head=head)
    if table.partition_by:
        keys = pred.partition_keys(table.schema, table.partition_by)
        if keys is not None:
            return table.files_at(conn, v, head=head, partitions=keys)
    from . import stats_sql
    from .plan import prunable

    if by_stats and prunable(pred, table.primary_key):
        cand = stats_sql.candidates(conn, pred, table.schema, table.table_id, stats_sql.covered(conn, table.table_id))
        if cand is not None:
            f = S.files.c
            q = sa.select(*FILE_COLS).where(
                f.table_id == table.table_id, f.added_version <= v,
                sa.or_(f.removed_version.is_(None), f.removed_version > v), f.file_id.in_(cand))
            return [row_to_file(r) for r in conn.execute(q.order_by(f.file_id)).all()]
    return table.files_at(conn, v, head=head)


def added_files(table: TableHandle, from_data_version: int, to_data_version: int) -> list[DataFile]:
    """:meth:`Table.added_files <lakestep.catalog.table.Table.added_files>`: the files a
    stream of the table emits for the data versions ``(from_data_version, to_data_version]``."""
    f, c = S.files.c, S.commits.c
    q = (
        sa.select(*FILE_COLS)
        .select_from(S.files.join(S.commits, sa.and_(c.table_id == f.table_id, c.version == f.added_version)))
        .where(f.table_id == table.table_id, c.data_version > from_data_version, c.data_version <= to_data_version,
               c.operation.in_(["APPEND", "MERGE", "OVERWRITE"]), f.source_ids.is_(None))
        .order_by(f.file_id)
    )
    with table.catalog.backend.read() as conn:
        return [row_to_file(r) for r in conn.execute(q)]


def as_of_schema(table: H, conn: sa.Connection, v: int, head: Head,
                 new: Callable[[CatalogLike, TableMeta], H]) -> H:
    """``table`` as version ``v`` saw it: this handle, or (time travel to before a schema
    change) a handle (made by ``new``) with that version's schema, key and partitioning
    (ls_schema). A handle whose schema is older than the head's (changed by another handle)
    takes the head's."""
    if v >= head.version:
        if head.schema_id == table.meta.schema_id:
            return table
        current = conn.execute(S.tables.select().where(S.tables.c.table_id == table.table_id)).mappings().first()
        if current is None:
            raise TableNotFoundError(table.ident)
        table._set_meta(TableMeta.from_row(current))
        return table
    h = S.schemas.c
    row = conn.execute(sa.select(h.schema_id, h.schema_ipc, h.column_ids, h.last_column_id, h.primary_key,
                                 h.partition_by).where(h.table_id == table.table_id, h.version <= v)
                       .order_by(h.version.desc()).limit(1)).first()
    if row is None or int(row.schema_id) == table.meta.schema_id:
        return table
    import dataclasses

    from .columns import ColumnIds

    meta = dataclasses.replace(
        table.meta, schema=pa.ipc.read_schema(pa.py_buffer(row.schema_ipc)), schema_id=int(row.schema_id),
        primary_key=json.loads(row.primary_key), partition_by=json.loads(row.partition_by),
        column_ids=ColumnIds.from_json(row.column_ids, int(row.last_column_id)))
    return new(table.catalog, meta)


def plan_at(table: TableHandle, conn: sa.Connection, v: int, head: int, where: Filter | Predicate | None,
            prune: bool) -> "ReadPlan":
    """The read plan of version ``v`` of ``table`` (a handle with that version's schema:
    :func:`as_of_schema`), its files narrowed by ``where`` (:func:`files_for`; with
    ``prune``, also by their statistics)."""
    from .plan import PlannedFile, ReadPlan, prunable

    pred = Predicate.parse(where, table.schema) if where is not None else None
    files = files_for(table, conn, v, head, pred, by_stats=prune)
    if prune and pred is not None and prunable(pred, table.primary_key):
        files = [f for f in files if pred.verdict(f) is not Verdict.NONE]
    dv = conn.execute(sa.select(S.commits.c.data_version).where(
        S.commits.c.table_id == table.table_id, S.commits.c.version == v)).scalar()
    return ReadPlan(
        table=table.ident, table_id=table.table_id, version=v, data_version=int(dv or 0), location=table.location,
        schema_ipc=table.schema.serialize().to_pybytes(),
        physical_ipc=table.physical_schema.serialize().to_pybytes(),
        primary_key=tuple(table.primary_key), partition_by=tuple(table.partition_by),
        schema_id=table.meta.schema_id, storage=table.catalog.storage,
        files=tuple(PlannedFile(path=f.path, uri=file_uri(table.location, f.path), record_count=f.record_count,
                                file_size=f.file_size, seq=f.seq, partition_json=f.partition_json,
                                stats_json=f.stats_json) for f in sorted(files, key=lambda f: f.seq)),
    )


def recorded_paths(table: TableHandle, paths: Sequence[str]) -> set[str]:
    """:meth:`Table.recorded_paths <lakestep.catalog.table.Table.recorded_paths>`: the
    ``paths`` some commit of ``table`` recorded, live or removed since."""
    found: set[str] = set()
    wanted = list(dict.fromkeys(paths))
    with table.catalog.backend.read() as conn:
        for i in range(0, len(wanted), 500):
            found.update(conn.execute(sa.select(S.files.c.path).where(
                S.files.c.table_id == table.table_id, S.files.c.path.in_(wanted[i:i + 500]))).scalars())
    return found


def history(table: TableHandle, *, limit: int | None = None) -> list[CommitInfo]:
    """:meth:`Table.history <lakestep.catalog.table.Table.history>`: commits, newest first."""
    c, t = S.commits.c, S.txns.c
    q = (
        sa.select(S.commits, t.job_id, t.batch_id)
        .select_from(S.commits.outerjoin(S.txns, c.txn_id == t.txn_id))
        .where(c.table_id == table.table_id)
        .order_by(c.version.desc())
    )
    if limit is not None:
        q = q.limit(limit)
    with table.catalog.backend.read() as conn:
        rows = conn.execute(q).mappings().all()
    return [
        CommitInfo(
            version=r["version"], data_version=r["data_version"], operation=r["operation"],
            base_version=r["base_version"], committed_at=r["committed_at"], barrier=r["barrier"],
            added_files=r["added_files"], removed_files=r["removed_files"], added_rows=r["added_rows"],
            removed_rows=r["removed_rows"], job_id=r["job_id"], batch_id=r["batch_id"],
            summary=json.loads(r["summary"] or "{}"),
        )
        for r in rows
    ]
