"""Commits: how prepared changes become visible, atomically, under concurrency.

The protocol of one catalog transaction (one or several tables):

1. Writers write their data files first, under unique names, with no lock
   held, and record what they read (``base_version``, the read set).
2. One metadata-database transaction then, in order:
   a. locks the rows of the tables it changes (PostgreSQL ``FOR UPDATE``,
      in table-id order; SQLite: one writer at a time);
   b. if the transaction carries an idempotency key ``(job_id, batch_id)``
      already recorded, returns the first result and changes nothing; a key
      at or below the job's newest recorded batch id is a replay too, even
      when cleanup has pruned its own record (cleanup keeps every job's
      newest key for as long as the catalog lives): nothing is committed and
      the tables' current versions are returned, marked replayed;
   c. decides, for every table, the outcome against the commits that landed
      after ``base_version`` (the matrix of docs/design.md §2) from metadata only:
      file ids, operations and file statistics; no data file is read;
   d. tombstones removed files, records added (and re-added) files, the
      commit row and the new head of each table;
   e. commits the database transaction: all tables or none.
3. If the database connection breaks, the writer reconnects and looks its
   transaction up by uuid: found means it landed (the result is returned),
   absent means it did not (it is retried, up to a limit).

:func:`commit` is the one loop that runs these steps and retries them; every
write (``Table``'s, a :class:`~lakestep.catalog.Transaction`, a barrier
batch, a rollback) commits through it. A single blind append or upsert takes
the backend's one-statement fast path (``Backend.commit_blind``, appends.py).

Only one case needs data I/O after the first attempt: an OVERWRITE of a
predicate range that a concurrent commit filled with files straddling the
range's edge. Those files (and only those) are rewritten outside the lock and
the commit is tried again (:class:`NeedsRebase`).

What is *not* guaranteed: files written by a transaction that never commits
stay on storage as orphans until cleanup removes them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterable, Protocol, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .. import _failpoints
from ..errors import CatalogError, CatalogUnavailableError, CommitConflict, SchemaChangedConflict, TableNotFoundError
from . import schema as S
from .files import DataFile, NewFile
from .predicates import Verdict
from .changes import (
    FILE_COLS,
    OPEN_EPOCH,
    CommitResult,
    KeyReplayed,
    NeedsRebase,
    Operation,
    TableChange,
    chunks,
    file_row,
    row_to_file,
)

log = logging.getLogger(__name__)


def _files_by_ids(conn: Connection, ids: Iterable[int]) -> list[DataFile]:
    ids = sorted(set(ids))
    out: list[DataFile] = []
    for chunk in chunks(ids):
        out.extend(row_to_file(r) for r in conn.execute(sa.select(*FILE_COLS).where(S.files.c.file_id.in_(chunk))))
    return out


def live_files(conn: Connection, table_id: int) -> list[DataFile]:
    q = sa.select(*FILE_COLS).where(S.files.c.table_id == table_id, S.files.c.removed_version.is_(None))
    return [row_to_file(r) for r in conn.execute(q)]


@dataclass
class _Head:
    table_id: int
    version: int
    data_version: int
    last_commit_at: float
    schema_id: int = 0


@dataclass
class _Plan:
    """The resolved effect of one change at the current head."""

    change: TableChange
    remove_ids: list[int] = field(default_factory=list)
    removed_rows: int = 0
    remove_all_live: bool = False
    add: list[NewFile] = field(default_factory=list)
    readd: list[DataFile] = field(default_factory=list)
    discarded: bool = False
    notes: dict[str, Any] = field(default_factory=dict)


class _Resolver:
    """Decides one change against the commits in ``(base_version, head]``."""

    def __init__(self, conn: Connection, change: TableChange, head: _Head, now: float) -> None:
        self.conn = conn
        self.c = change
        self.head = head
        self.now = now
        self._ops: dict[int, tuple[str, float]] | None = None

    # concurrent commits: version -> (operation, committed_at)
    @property
    def ops(self) -> dict[int, tuple[str, float]]:
        if self._ops is None:
            q = sa.select(S.commits.c.version, S.commits.c.operation, S.commits.c.committed_at).where(
                S.commits.c.table_id == self.c.table_id, S.commits.c.version > self.c.base_version
            )
            self._ops = {r[0]: (r[1], r[2]) for r in self.conn.execute(q)}
        return self._ops

    def conflict(self, other_version: int, reason: str) -> CommitConflict:
        return CommitConflict(
            table=self.c.ident,
            operation=self.c.operation.value,
            base_version=self.c.base_version,
            other_version=other_version,
            other_operation=self.ops.get(other_version, ("?", 0.0))[0],
            reason=reason,
        )

    def resolve(self) -> _Plan:
        op = self.c.operation
        if self.c.blind:
            return _Plan(self.c, add=list(self.c.added))
        if op is Operation.COMPACT:
            return self._compact()
        if op is Operation.OVERWRITE:
            return self._overwrite()
        if op.rewrites_rows:
            return self._rewrite()
        if op is Operation.RESTORE:
            return self._restore()
        raise ValueError(f"cannot commit operation {op}")

    # ---------------------------------------------------------------- COMPACT
    def _compact(self) -> _Plan:
        ids = sorted(self.c.read_ids)
        if self.c.base_version != self.head.version:
            gone = self._removed_among(ids)
            if gone:
                fid, rv = next(iter(gone.items()))
                log.info(
                    "compaction of %s discarded: input file %s was removed by version %s (%s)",
                    self.c.ident, fid, rv, self.ops.get(rv, ("?",))[0],
                )
                return _Plan(self.c, discarded=True, notes={"discarded_by": rv})
        return _Plan(
            self.c,
            remove_ids=ids,
            removed_rows=sum(f.record_count for f in self.c.removed),
            add=list(self.c.added),
        )

    def _removed_among(self, ids: Sequence[int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for chunk in chunks(list(ids)):
            q = sa.select(S.files.c.file_id, S.files.c.removed_version).where(
                S.files.c.file_id.in_(chunk), S.files.c.removed_version.is_not(None)
            )
            out.update({r[0]: r[1] for r in self.conn.execute(q)})
        return out

    # ------------------------------------------------------------- OVERWRITE
    def _overwrite(self) -> _Plan:
        c = self.c
        plan = _Plan(c)
        if c.scope is None:  # the whole table: everything live at commit time
            plan.remove_all_live = True
            plan.add = list(c.added)
            return plan
        live = live_files(self.conn, c.table_id)
        live_ids = {f.file_id for f in live}
        rewritten = {s for f in c.added for s in f.source_ids}
        # Rewrites of files a concurrent commit already replaced are stale: drop
        # them; whatever replaced those files is judged below like any live file.
        plan.add = [f for f in c.added if not f.source_ids or all(s in live_ids for s in f.source_ids)]
        if len(plan.add) != len(c.added):
            plan.notes["stale_rewrites"] = len(c.added) - len(plan.add)
        todo: list[DataFile] = []
        for f in live:
            v = c.scope.verdict(f)
            if v is Verdict.NONE:
                continue
            if v is Verdict.ALL or f.file_id in rewritten:
                plan.remove_ids.append(f.file_id)
                plan.removed_rows += f.record_count
            else:
                todo.append(f)
        if todo:
            raise NeedsRebase(c, todo)
        return plan

    # ------------------------------------------------- DELETE / UPDATE / MERGE
    def _rewrite(self) -> _Plan:
        c = self.c
        read = c.read_ids
        plan = _Plan(c, add=list(c.added))
        if c.base_version == self.head.version:
            plan.remove_ids = sorted(read)
            plan.removed_rows = sum(f.record_count for f in c.removed)
            return plan
        gone = self._removed_among(sorted(read))
        for fid, rv in sorted(gone.items()):
            if self.ops.get(rv, ("?",))[0] != Operation.COMPACT.value:
                raise self.conflict(rv, f"file {fid} that this {c.operation.value} read was removed")
        if gone:
            self._undo_compactions(plan, gone)
        still_live = [f for f in c.removed if f.file_id not in gone]
        plan.remove_ids.extend(f.file_id for f in still_live)
        plan.removed_rows += sum(f.record_count for f in still_live)
        if c.isolation == "serializable" and c.scope is not None:
            self._check_serializable()
        return plan

    def _undo_compactions(self, plan: _Plan, gone: dict[int, int]) -> None:
        """Undo, by metadata, the concurrent compactions that took files L read.

        The compaction outputs holding those rows are removed; their other
        inputs, whose bytes are still on storage within the retention window,
        are recorded again. Compactions of compaction outputs are undone too.
        """
        read = self.c.read_ids
        pending = list(gone.items())
        undone: dict[int, DataFile] = {}
        while pending:
            fid, rv = pending.pop()
            op, at = self.ops.get(rv, ("?", 0.0))
            if op != Operation.COMPACT.value:
                raise self.conflict(rv, f"file {fid} holding rows this {self.c.operation.value} read was removed")
            if at + self.c.retention_seconds < self.now:
                raise self.conflict(rv, "the compaction that took the files read is older than the retention window")
            q = sa.select(*FILE_COLS).where(
                S.files.c.table_id == self.c.table_id,
                S.files.c.added_version == rv,
                S.files.c.source_ids.is_not(None),
            )
            for out in map(row_to_file, self.conn.execute(q)):
                if fid not in out.source_ids or out.file_id in undone:
                    continue
                undone[out.file_id] = out
                if out.removed_version is not None:  # compacted again, or worse
                    pending.append((out.file_id, out.removed_version))
        sources = {s for o in undone.values() for s in o.source_ids} - read - set(undone)
        readd = _files_by_ids(self.conn, sources)
        for f in readd:
            rv = f.removed_version
            if rv is None:
                continue  # still live: nothing to restore
            op, at = self.ops.get(rv, ("?", 0.0))
            if op != Operation.COMPACT.value or f.file_id not in {s for o in undone.values() if o.added_version == rv for s in o.source_ids}:
                raise self.conflict(rv, f"file {f.file_id} to restore was removed by a {op}")
            if at + self.c.retention_seconds < self.now:
                raise self.conflict(rv, "the files to restore are past the retention window")
            plan.readd.append(f)
        live_outputs = [o for o in undone.values() if o.removed_version is None]
        plan.remove_ids.extend(o.file_id for o in live_outputs)
        plan.removed_rows += sum(o.record_count for o in live_outputs)
        plan.notes["undone_compactions"] = sorted({o.added_version for o in undone.values()})
        plan.notes["restored_files"] = len(plan.readd)

    def _check_serializable(self) -> None:
        assert self.c.scope is not None
        q = sa.select(*FILE_COLS).where(
            S.files.c.table_id == self.c.table_id, S.files.c.added_version > self.c.base_version
        )
        for f in map(row_to_file, self.conn.execute(q)):
            if self.ops.get(f.added_version, ("?",))[0] == Operation.COMPACT.value:
                continue  # compaction outputs hold rows that existed before
            if self.c.scope.verdict(f) is not Verdict.NONE:
                raise self.conflict(
                    f.added_version,
                    f"serializable isolation: file {f.file_id} added concurrently may hold rows matching the predicate",
                )

    # ---------------------------------------------------------------- RESTORE
    def _restore(self) -> _Plan:
        """RESTORE: make the live files exactly those live at ``base_version``, by metadata.

        1. every live file whose path was not live at the target is removed;
        2. every file live at the target whose path is no longer live is recorded
           again (a new file row, same path and statistics);
        3. re-adding a file removed longer ago than the retention window is
           refused (cleanup may have deleted its bytes) unless a live snapshot or
           version lock pins a version where it was live.

        Commits that landed after the target, concurrent ones included, are all
        undone: the table then holds exactly the rows of the target version.
        """
        c, v = self.c, self.c.base_version
        if not 0 <= v <= self.head.version:
            raise ValueError(f"{c.ident}: cannot restore version {v} (newest is {self.head.version})")
        f = S.files.c
        at_v = [row_to_file(r) for r in self.conn.execute(sa.select(*FILE_COLS).where(
            f.table_id == c.table_id, f.added_version <= v,
            sa.or_(f.removed_version.is_(None), f.removed_version > v)))]
        live = live_files(self.conn, c.table_id)
        want, have = {x.path for x in at_v}, {x.path for x in live}
        plan = _Plan(c, notes={"restored_to": v})
        for x in live:
            if x.path not in want:
                plan.remove_ids.append(x.file_id)
                plan.removed_rows += x.record_count
        pinned: list[int] | None = None
        for x in at_v:
            if x.path in have:
                continue
            rv = int(x.removed_version or 0)
            if self.ops.get(rv, ("?", 0.0))[1] + c.retention_seconds < self.now:
                if pinned is None:
                    pinned = self._pinned_versions()
                if not any(x.added_version <= w < rv for w in pinned):
                    raise self.conflict(rv, f"file {x.file_id} to restore was removed past the retention window")
            plan.readd.append(x)
        plan.notes["restored_files"] = len(plan.readd)
        return plan

    def _pinned_versions(self) -> list[int]:
        """Versions of this table kept readable by a live snapshot or version lock."""
        out: list[int] = []
        for t in (S.snapshots, S.locks):
            q = sa.select(t.c.version).where(
                t.c.table_id == self.c.table_id, sa.or_(t.c.expires_at.is_(None), t.c.expires_at > self.now))
            out.extend(int(r[0]) for r in self.conn.execute(q))
        return out


# ---------------------------------------------------------------------------
# Prebuilt statements: the commit path builds no SQL at run time.
_LOCK_HEADS = (
    sa.select(S.tables.c.table_id, S.tables.c.version, S.tables.c.data_version, S.tables.c.last_commit_at,
              S.tables.c.schema_id)
    .where(S.tables.c.table_id.in_(sa.bindparam("ids", expanding=True)))
    .order_by(S.tables.c.table_id)
    .with_for_update()
)
_FIND_BY_KEY = sa.select(S.txns.c.txn_id).where(
    S.txns.c.job_id == sa.bindparam("job"), S.txns.c.batch_id == sa.bindparam("batch")
)
_FIND_BY_UUID = sa.select(S.txns.c.txn_id).where(S.txns.c.txn_uuid == sa.bindparam("uuid"))
_INSERT_TXN = sa.insert(S.txns).returning(S.txns.c.txn_id)
# Step 2b: a key at or below the job's newest recorded batch is a replay.
_KEY_TAKEN = sa.select(sa.literal(1)).where(
    S.txns.c.job_id == sa.bindparam("job"), S.txns.c.batch_id >= sa.bindparam("batch")).limit(1)
# FOR SHARE on PostgreSQL (a seal's FOR UPDATE waits for it); SQLite has one writer.
READ_OPEN_EPOCH = sa.select(S.epoch.c.open_epoch).where(S.epoch.c.id == 1).with_for_update(read=True)
_INSERT_FILES = sa.insert(S.files)
_INSERT_COMMIT = sa.insert(S.commits)
_UPDATE_HEAD = (
    sa.update(S.tables)
    .where(S.tables.c.table_id == sa.bindparam("tid"), S.tables.c.version == sa.bindparam("old_version"))
    .values(
        version=sa.bindparam("new_version"),
        data_version=sa.bindparam("new_data_version"),
        last_commit_at=sa.bindparam("at"),
    )
)
def open_epoch_for_commit(conn: Connection) -> int:
    """The open epoch, read inside the commit's own database transaction under the
    lock that sealing waits for: the catalog's one read of the epoch (barrier/epochs.py
    owns every other one)."""
    return int(conn.execute(READ_OPEN_EPOCH).scalar_one())


def _lock_heads(conn: Connection, changes: Sequence[TableChange]) -> dict[int, _Head]:
    ids = sorted({c.table_id for c in changes})
    heads = {r[0]: _Head(r[0], r[1], r[2], r[3], r[4]) for r in conn.execute(_LOCK_HEADS, {"ids": ids})}
    for c in changes:
        head = heads.get(c.table_id)
        if head is None:
            raise TableNotFoundError(c.ident)
        if c.schema_id is not None and not c.blind and c.schema_id != head.schema_id:
            # Files read with the old schema and rewritten would lose the new columns' values.
            raise SchemaChangedConflict(
                table=c.ident, operation=c.operation.value, base_version=c.base_version,
                other_version=head.version, other_operation="ADD COLUMNS",
                reason="the table's schema changed after this writer read it; reload the table and retry")
    return heads


def find_txn(conn: Connection, *, txn_uuid: str | None = None, key: tuple[str, int] | None = None) -> int | None:
    if key is not None:
        row = conn.execute(_FIND_BY_KEY, {"job": key[0], "batch": key[1]}).first()
    else:
        row = conn.execute(_FIND_BY_UUID, {"uuid": txn_uuid}).first()
    return row[0] if row else None


def txn_results(conn: Connection, txn_id: int, idents: dict[int, str], *, replayed: bool = True) -> list[CommitResult]:
    """The commits of a recorded transaction; ``replayed``: returned to a replay of it (not its first caller)."""
    q = sa.select(S.commits).where(S.commits.c.txn_id == txn_id).order_by(S.commits.c.table_id)
    out = []
    for r in conn.execute(q).mappings():
        out.append(
            CommitResult(
                table=idents.get(r["table_id"], str(r["table_id"])),
                version=r["version"],
                data_version=r["data_version"],
                operation=r["operation"],
                base_version=r["base_version"],
                added_files=r["added_files"],
                removed_files=r["removed_files"],
                added_rows=r["added_rows"],
                removed_rows=r["removed_rows"],
                barrier=r["barrier"],
                committed_at=r["committed_at"],
                replayed=replayed,
                summary=json.loads(r["summary"] or "{}"),
            )
        )
    return out


def txn_record(txn_uuid: str, job_id: str | None, batch_id: int | None) -> dict[str, Any]:
    """The ``ls_txn`` row of one commit attempt (its clock reading is the commit's time)."""
    return {"txn_uuid": txn_uuid, "job_id": job_id, "batch_id": None if job_id is None else int(batch_id or 0),
            "committed_at": time.time()}


def commit_once(conn: Connection, changes: Sequence[TableChange], txn_row: dict[str, Any]) -> list[CommitResult]:
    """Steps 2a-2d of the protocol, inside the caller's write transaction (changes that
    only add rows commit through their backend's blind append instead, appends.py).

    A transaction whose idempotency key is already recorded fails its
    ``ls_txn`` insert on the unique index (``IntegrityError``); the caller then
    returns the recorded result.
    """
    now = txn_row["committed_at"]
    job_id = txn_row["job_id"]
    if job_id is not None and conn.execute(_KEY_TAKEN, {"job": job_id, "batch": txn_row["batch_id"]}).first():
        raise KeyReplayed(job_id, txn_row["batch_id"])
    if any(c.barrier == OPEN_EPOCH for c in changes):
        open_epoch = open_epoch_for_commit(conn)
        changes = [dataclasses.replace(c, barrier=open_epoch) if c.barrier == OPEN_EPOCH else c for c in changes]

    heads = _lock_heads(conn, changes)
    txn_id = conn.execute(_INSERT_TXN, txn_row).scalar_one()
    _failpoints.hit("commit.locked")
    plans = [_Resolver(conn, c, heads[c.table_id], now).resolve() for c in changes]
    committed_at = max([now] + [heads[c.table_id].last_commit_at + 1e-6 for c in changes])

    results: list[CommitResult] = []
    for plan in plans:
        c = plan.change
        head = heads[c.table_id]
        if plan.discarded:
            results.append(
                CommitResult(
                    table=c.ident, version=head.version, data_version=head.data_version,
                    operation=c.operation.value, base_version=c.base_version, discarded=True,
                    committed_at=committed_at, summary=plan.notes,
                )
            )
            continue
        v = head.version + 1
        removed_files = _apply_removals(conn, plan, v)
        _failpoints.hit("commit.after_remove")
        n_added = _insert_files(conn, c.table_id, v, plan.add, plan.readd)
        changed = n_added > 0 or removed_files > 0
        dv = head.data_version + 1 if (c.operation.changes_data and changed) else head.data_version
        upd = conn.execute(
            _UPDATE_HEAD,
            {"tid": c.table_id, "old_version": head.version, "new_version": v, "new_data_version": dv,
             "at": committed_at},
        )
        if upd.rowcount != 1:  # cannot happen while the row is locked; never commit blindly
            raise RuntimeError(f"head of {c.ident} moved during a locked commit")
        added_rows = sum(f.record_count for f in plan.add) + sum(f.record_count for f in plan.readd)
        results.append(_record_commit(
            conn, c, txn_id=txn_id, version=v, data_version=dv, base=c.base_version, committed_at=committed_at,
            added_files=n_added, removed_files=removed_files, added_rows=added_rows,
            removed_rows=plan.removed_rows, summary={**c.summary, **plan.notes},
        ))
        _failpoints.hit("commit.table_done")
    _failpoints.hit("commit.before_db_commit")
    return results


def _insert_files(
    conn: Connection, table_id: int, version: int, added: Sequence[NewFile], readd: Sequence[DataFile]
) -> int:
    rows = [file_row(table_id, version, f) for f in (*added, *readd)]
    if rows:
        conn.execute(_INSERT_FILES, rows)
    return len(rows)


def _record_commit(
    conn: Connection, c: TableChange, *, txn_id: int, version: int, data_version: int, base: int,
    committed_at: float, added_files: int, removed_files: int, added_rows: int, removed_rows: int,
    summary: dict[str, Any],
) -> CommitResult:
    conn.execute(
        _INSERT_COMMIT,
        {
            "table_id": c.table_id, "version": version, "data_version": data_version,
            "operation": c.operation.value, "base_version": base, "txn_id": txn_id, "barrier": c.barrier,
            "committed_at": committed_at, "added_files": added_files, "removed_files": removed_files,
            "added_rows": added_rows, "removed_rows": removed_rows,
            "summary": json.dumps(summary, default=str) if summary else "{}",
        },
    )
    return CommitResult(
        table=c.ident, version=version, data_version=data_version, operation=c.operation.value,
        base_version=base, added_files=added_files, removed_files=removed_files, added_rows=added_rows,
        removed_rows=removed_rows, barrier=c.barrier, committed_at=committed_at, summary=summary,
    )


def _apply_removals(conn: Connection, plan: _Plan, v: int) -> int:
    t = S.files.c
    if plan.remove_all_live:
        rows = conn.execute(
            sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(t.record_count), 0)).where(
                t.table_id == plan.change.table_id, t.removed_version.is_(None)
            )
        ).one()
        conn.execute(
            sa.update(S.files)
            .where(t.table_id == plan.change.table_id, t.removed_version.is_(None))
            .values(removed_version=v)
        )
        plan.removed_rows = int(rows[1])
        return int(rows[0])
    n = 0
    ids = sorted(set(plan.remove_ids))
    for chunk in chunks(ids):
        res = conn.execute(
            sa.update(S.files)
            .where(t.file_id.in_(chunk), t.table_id == plan.change.table_id, t.removed_version.is_(None))
            .values(removed_version=v)
        )
        n += res.rowcount
    if n != len(ids):  # a file removed twice would lose or duplicate rows: refuse
        raise RuntimeError(f"{plan.change.ident}: {len(ids) - n} file(s) to remove were no longer live")
    return n


def new_txn_uuid() -> str:
    return str(uuid.uuid4())


# ---------------------------------------------------------------------------
MAX_REBASES = 20

#: Runs first in a commit's database transaction: None to go on, or results to return
#: without committing (a replay). Whatever it raises aborts the commit.
Guard = Callable[[Connection], "list[CommitResult] | None"]
#: Runs in the same database transaction, after the commit, with its results.
After = Callable[[Connection, "list[CommitResult]"], None]


class CommitBackend(Protocol):
    """What the commit loop needs of a database backend (backend.py's :class:`Backend`)."""

    def write(self) -> ContextManager[Connection]: ...

    def read(self) -> ContextManager[Connection]: ...

    def append(self, conn: Connection, changes: Sequence[TableChange], txn: dict[str, Any]
               ) -> list[CommitResult]: ...

    def commit_blind(self, change: TableChange, txn: dict[str, Any]) -> CommitResult: ...


def commit(
    backend: "CommitBackend",
    changes: Sequence[TableChange],
    *,
    retries: int,
    guard: Guard | None = None,
    after: After | None = None,
    job_id: str | None = None,
    batch_id: int | None = None,
) -> tuple[bool, list[CommitResult]]:
    """The protocol above, with its one retry loop; returns (committed, results).

    ``guard`` runs first in the database transaction: None to go on, or
    results to return without committing (a replay); it may fill ``changes``
    in (rollback computes them under its locks). ``after`` runs in the same
    transaction, after the commit. An OVERWRITE rebases onto files that landed
    concurrently (:class:`NeedsRebase`, up to ``MAX_REBASES`` times); transient
    database errors are retried ``retries`` times, and a commit that landed
    before its connection broke is found by its uuid (step 3); a concurrent
    commit with the same ``(job_id, batch_id)`` returns that one's results
    (committed=False).
    """
    txn_uuid = new_txn_uuid()
    attempts = rebases = 0
    fast = guard is None and after is None and len(changes) == 1 and changes[0].blind
    idents = {c.table_id: c.ident for c in changes}
    while True:
        try:
            txn = txn_record(txn_uuid, job_id, batch_id)
            if fast:  # one blind append/upsert: the streaming hot path, one round trip on PostgreSQL
                result = backend.commit_blind(changes[0], txn)
                _failpoints.hit("commit.after_db_commit")
                return True, [result]
            with backend.write() as conn:
                stop = guard(conn) if guard is not None else None
                if stop is not None:
                    return False, stop
                if all(c.blind for c in changes):  # appends and upserts: the backend's blind append
                    results = backend.append(conn, changes, txn)
                else:
                    results = commit_once(conn, changes, txn)
                if after is not None:
                    after(conn, results)
            _failpoints.hit("commit.after_db_commit")
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
        except KeyReplayed as kr:
            return False, _replayed(backend, changes, kr)
        except sa.exc.IntegrityError as e:
            with backend.read() as conn:
                # An earlier attempt of this very transaction landed (its outcome was unknown)?
                prior = find_txn(conn, txn_uuid=txn_uuid)
                if prior is not None:
                    log.warning("an earlier attempt of this commit had landed; returning its result")
                    return True, txn_results(conn, prior, idents, replayed=False)
                # A concurrent commit with the same idempotency key won the race.
                prior = None if job_id is None else find_txn(conn, key=(job_id, int(batch_id or 0)))
            if prior is None:
                raise CatalogError(f"the catalog database refused the commit: {e.orig}") from e
            assert job_id is not None
            return False, _replayed(backend, changes, KeyReplayed(job_id, int(batch_id or 0)))
        except CatalogUnavailableError as e:
            attempts += 1
            known = False
            try:  # did it land before the connection broke?
                with backend.read() as conn:
                    prior = find_txn(conn, txn_uuid=txn_uuid)
                    known = True
                    if prior is not None:
                        log.warning("commit landed before the connection broke; returning its result")
                        return True, txn_results(conn, prior, idents, replayed=False)
            except CatalogUnavailableError:
                pass
            if attempts > retries:
                raise CatalogUnavailableError(
                    f"{e} (gave up after {attempts} attempts; "
                    + ("the commit did not land" if known else "whether the commit landed is unknown: "
                       "replaying it with the same (job_id, batch_id) is safe") + ")",
                    outcome_unknown=not known) from e
            delay = min(2.0, 0.05 * 2 ** attempts)
            log.warning("catalog database unavailable (%s); retry %d/%d in %.2fs", e, attempts,
                        retries, delay)
            time.sleep(delay)


def _replayed(backend: "CommitBackend", changes: Sequence[TableChange], kr: KeyReplayed) -> list[CommitResult]:
    """The results of a replayed key (commit.py step 2b): the first commit's, when its
    record is still there; else each table's current version, marked replayed."""
    idents = {c.table_id: c.ident for c in changes}
    with backend.read() as conn:
        prior = find_txn(conn, key=(kr.job_id, kr.batch_id))
        results = [] if prior is None else txn_results(conn, prior, idents)
        if results:
            log.info("transaction (%s, %s) was committed before: returning its result", kr.job_id, kr.batch_id)
            return results
        # its record is gone, or kept (a job's newest) while cleanup pruned its commit rows
        newest = conn.execute(sa.select(sa.func.max(S.txns.c.batch_id)).where(
            S.txns.c.job_id == kr.job_id)).scalar()
        heads = {r[0]: (int(r[1]), int(r[2])) for r in conn.execute(
            sa.select(S.tables.c.table_id, S.tables.c.version, S.tables.c.data_version)
            .where(S.tables.c.table_id.in_(list(idents))))}
    if newest is None or int(newest) < kr.batch_id:  # the fast path's head was missing, not a replay
        missing = next(c for c in changes if c.table_id not in heads)
        raise TableNotFoundError(missing.ident)
    log.warning("job %s batch %d is at or below its newest committed batch %s: a replay (its own record was "
                "pruned by cleanup); nothing committed. A job id belongs to one stream of batch ids: a new "
                "checkpoint needs a new job id", kr.job_id, kr.batch_id, newest)
    note = {"replay_of_pruned_batch": True, "newest_batch": int(newest)}
    return [CommitResult(table=c.ident, version=heads[c.table_id][0], data_version=heads[c.table_id][1],
                         operation=c.operation.value, base_version=heads[c.table_id][0], replayed=True,
                         summary=note) for c in changes]
