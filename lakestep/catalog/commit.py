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
      after ``base_version`` (the matrix of docs/design.md §2, as data in
      ``resolver.MATRIX``) from metadata only: file ids, operations and file
      statistics; no data file is read;
   d. tombstones removed files, records added (and re-added) files, the
      commit row and the new head of each table;
   e. commits the database transaction: all tables or none.
3. If the database connection breaks, the writer reconnects and looks its
   transaction up by uuid: found means it landed (the result is returned),
   absent means it did not (it is retried, up to a limit: the catalog's
   ``commit_retries``, or inside :func:`lakestep.retry.retrying` the caller's
   wait with its deadline). A retry that finds its idempotency key taken,
   or whose guard calls it a replay (a barrier batch already committed),
   first checks whether that is its own uuid (an earlier attempt landed, its
   answer lost): then the commit is returned as landed, not as a replay,
   and its files are kept.

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
import functools
import json
import logging
import time
import uuid
from typing import Any, Callable, ContextManager, Protocol, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .. import _failpoints, retry
from ..clock import Clock
from ..errors import (
    CatalogError,
    CatalogUnavailableError,
    CommitConflict,
    InternalError,
    SchemaChangedConflict,
    TableNotFoundError,
)
from . import epoch, stats_sql
from . import schema as S
from .changes import (
    FILE_ROW_FIELDS,
    CommitResult,
    KeyReplayed,
    NeedsRebase,
    TableChange,
    chunks,
    file_values,
    warn_older_schema,
)
from .epoch import OPEN_EPOCH
from .files import DataFile, NewFile
from .resolver import Head, ResolvedChange, Resolver

log = logging.getLogger(__name__)


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
_INSERT_COMMIT = sa.insert(S.commits)
_UPDATE_HEAD = (
    sa.update(S.tables)
    .where(S.tables.c.table_id == sa.bindparam("tid"), S.tables.c.version == sa.bindparam("old_version"))
    .values(
        version=sa.bindparam("new_version"),
        data_version=sa.bindparam("new_data_version"),
        last_commit_at=sa.bindparam("at"),
        stamp=S.NextStamp(),
    )
)


def _lock_heads(conn: Connection, changes: Sequence[TableChange]) -> dict[int, Head]:
    ids = sorted({c.table_id for c in changes})
    heads = {r[0]: Head(r[0], r[1], r[2], r[3], r[4]) for r in conn.execute(_LOCK_HEADS, {"ids": ids})}
    for c in changes:
        head = heads.get(c.table_id)
        if head is None:
            raise TableNotFoundError(c.ident)
        if c.blind:
            warn_older_schema(c, head.schema_id)
        elif c.schema_id is not None and c.schema_id != head.schema_id:
            # Files read with the old schema and rewritten would lose what the change made (a new
            # column's values, a rename's name). Named: the first ALTER after the writer's schema.
            h = S.schemas.c
            alter_v = conn.execute(sa.select(h.version).where(h.table_id == c.table_id, h.schema_id > c.schema_id)
                                   .order_by(h.schema_id).limit(1)).scalar()
            raise SchemaChangedConflict(
                table=c.ident, operation=c.operation.value, base_version=c.base_version,
                other_version=head.version if alter_v is None else int(alter_v), other_operation="ALTER",
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


def txn_record(txn_uuid: str, job_id: str | None, batch_id: int | None, now: float | None = None) -> dict[str, Any]:
    """The ``ls_txn`` row of one commit attempt (its clock reading, ``now``: the catalog's
    clock, lakestep/clock.py, is the commit's time)."""
    return {"txn_uuid": txn_uuid, "job_id": job_id, "batch_id": None if job_id is None else int(batch_id or 0),
            "committed_at": time.time() if now is None else now}


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
        open_ = epoch.read_for_commit(conn)
        changes = [dataclasses.replace(c, barrier=epoch.stamp(c.barrier, open_)) for c in changes]

    heads = _lock_heads(conn, changes)
    txn_id = conn.execute(_INSERT_TXN, txn_row).scalar_one()
    _failpoints.hit("commit.locked")
    plans = [Resolver(conn, c, heads[c.table_id], now).resolve() for c in changes]
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
            raise InternalError(f"head of {c.ident} moved during a locked commit")
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
    files: tuple[NewFile | DataFile, ...] = (*added, *readd)
    if files:
        ids = insert_file_rows(conn, [file_values(table_id, version, f) for f in files])
        record_file_stats(conn, table_id, ids, files)
    return len(files)


#: File rows per INSERT statement of :func:`insert_file_rows` (10 parameters a row: far
#: below the parameters SQLite and PostgreSQL take in one statement).
FILE_CHUNK = 500
_PATH = FILE_ROW_FIELDS.index("path")


@functools.lru_cache(maxsize=64)
def insert_files_sql(n: int, mark: str) -> str:
    """The INSERT of ``n`` file rows, ``mark`` the driver's positional parameter."""
    row = f"({', '.join([mark] * len(FILE_ROW_FIELDS))})"
    return (f"INSERT INTO ls_file ({', '.join(FILE_ROW_FIELDS)}) VALUES {', '.join([row] * n)} "
            "RETURNING file_id, path")


def insert_file_rows(conn: Connection, values: Sequence[tuple[Any, ...]]) -> list[int]:
    """Insert new ``ls_file`` rows (tuples of ``FILE_ROW_FIELDS``: changes.file_values) in the
    caller's transaction; return their ids, in the order of ``values``.

    One statement per :data:`FILE_CHUNK` rows (a multi-row VALUES, on both backends), whose
    RETURNING gives the ids: nothing is read back. Neither database promises the order of
    RETURNING rows, so ids are matched to rows by path; a path twice in one statement (a
    file re-added twice) takes its ids in id order, which is insertion order on both
    backends and, either way, the same file with the same statistics."""
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    ids: list[int] = []
    for i in range(0, len(values), FILE_CHUNK):
        chunk = values[i:i + FILE_CHUNK]
        params = chunk[0] if len(chunk) == 1 else tuple([v for row in chunk for v in row])
        got = conn.exec_driver_sql(insert_files_sql(len(chunk), mark), params).all()
        ids.extend(ids_in_order([row[_PATH] for row in chunk], got))
    return ids


def ids_in_order(paths: Sequence[str], got: Sequence[Any]) -> list[int]:
    """The ids of RETURNING rows (file_id, path), in the order of ``paths``."""
    if len(got) != len(paths):
        raise InternalError(f"inserted {len(paths)} file rows, the database returned {len(got)} ids")
    if len(paths) == 1:
        return [int(got[0][0])]
    by_path: dict[str, list[int]] = {}
    for fid, path in sorted((int(r[0]), r[1]) for r in got):
        by_path.setdefault(path, []).append(fid)
    try:
        return [by_path[p].pop(0) for p in paths]
    except (KeyError, IndexError):
        raise InternalError("the ids the database returned for new file rows do not match their paths") from None


def record_file_stats(conn: Connection, table_id: int, file_ids: Sequence[int],
                      files: Sequence[NewFile | DataFile]) -> None:
    """The typed statistics rows (stats_sql.py) and column sets of files just inserted with
    ids ``file_ids`` (same order), in the same transaction (stats_sql.insert_added)."""
    stats_sql.insert_added(conn, table_id, [(fid, f.record_count, f.stats_json) for fid, f in zip(file_ids, files)])


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


def _apply_removals(conn: Connection, plan: ResolvedChange, v: int) -> int:
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
        raise InternalError(f"{plan.change.ident}: {len(ids) - n} file(s) to remove were no longer live")
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
    clock: Clock | None = None,
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
    (committed=False). Commit times come from ``clock`` (the catalog's, lakestep/clock.py).
    """
    txn_uuid = new_txn_uuid()
    rebases = failures = 0
    fast = guard is None and after is None and len(changes) == 1 and changes[0].blind
    idents = {c.table_id: c.ident for c in changes}
    # Inside retry.retrying (a sink, the coordinator, ...) the commit waits under the caller's wait;
    # otherwise under the catalog's own policy: ``retries`` quick retries.
    wait = retry.active() or retry.Wait(retry.RetryPolicy.counted(retries),
                                        f"commit to {', '.join(sorted(set(idents.values())))}", logger=log)

    def lost(e: CatalogUnavailableError) -> list[CommitResult] | None:
        """Step 3: the results if an attempt landed (the wait then succeeded); else wait for the
        next attempt (raises CatalogWaitExpiredError when the wait gives up)."""
        nonlocal failures
        failures += 1
        known = False
        try:  # did it land before the connection broke?
            with backend.read() as conn:
                prior = find_txn(conn, txn_uuid=txn_uuid)
                known = True
                if prior is not None:
                    log.warning("commit landed before the connection broke; returning its result")
                    wait.succeeded()
                    return txn_results(conn, prior, idents, replayed=False)
        except CatalogUnavailableError:
            pass
        wait.failed(e, outcome_unknown=not known,
                    detail="the commit did not land" if known else "whether the commit landed is unknown: "
                    "replaying it with the same (job_id, batch_id) is safe")
        return None

    def landed_earlier(conn: Connection, *, always: bool = False) -> list[CommitResult] | None:
        """The results of an earlier attempt of this very transaction that landed though its
        answer was lost (looked up after a failure, or ``always``)."""
        prior = find_txn(conn, txn_uuid=txn_uuid) if failures or always else None
        if prior is None:
            return None
        log.warning("an earlier attempt of this commit had landed; returning its result")
        return txn_results(conn, prior, idents, replayed=False)

    while True:
        try:
            txn = txn_record(txn_uuid, job_id, batch_id, None if clock is None else clock.now())
            if fast:  # one blind append/upsert: the streaming hot path, one round trip on PostgreSQL
                result = backend.commit_blind(changes[0], txn)
                _failpoints.hit("commit.after_db_commit")
                wait.succeeded()
                return True, [result]
            with backend.write() as conn:
                stop = guard(conn) if guard is not None else None
                if stop is not None:
                    # the guard's replay may be this very transaction, landed by an attempt whose answer was lost
                    landed = landed_earlier(conn)
                    wait.succeeded()
                    return (True, landed) if landed is not None else (False, stop)
                if all(c.blind for c in changes):  # appends and upserts: the backend's blind append
                    results = backend.append(conn, changes, txn)
                else:
                    results = commit_once(conn, changes, txn)
                if after is not None:
                    after(conn, results)
            _failpoints.hit("commit.after_db_commit")
            wait.succeeded()
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
            _failpoints.hit("commit.rebased")  # after the rewrite, before the next attempt
        except KeyReplayed as kr:
            try:
                if failures:  # the key may be this very transaction's, landed by an attempt whose answer was lost
                    with backend.read() as conn:
                        landed = landed_earlier(conn)
                    if landed is not None:
                        wait.succeeded()
                        return True, landed
                replayed = _replayed(backend, changes, kr)
            except CatalogUnavailableError as e:
                landed = lost(e)
                if landed is not None:
                    return True, landed
                continue
            wait.succeeded()
            return False, replayed
        except sa.exc.IntegrityError as e:
            try:
                with backend.read() as conn:
                    # An earlier attempt of this very transaction landed (its outcome was unknown)?
                    landed = landed_earlier(conn, always=True)
                    # Else a concurrent commit with the same idempotency key won the race.
                    prior = None if job_id is None or landed is not None else find_txn(
                        conn, key=(job_id, int(batch_id or 0)))
                if landed is not None:
                    wait.succeeded()
                    return True, landed
                if prior is None:
                    raise CatalogError(f"the catalog database refused the commit: {e.orig}") from e
                assert job_id is not None
                replayed = _replayed(backend, changes, KeyReplayed(job_id, int(batch_id or 0)))
            except CatalogUnavailableError as lost_answer:
                landed = lost(lost_answer)
                if landed is not None:
                    return True, landed
                continue
            wait.succeeded()
            return False, replayed
        except CatalogUnavailableError as e:
            landed = lost(e)
            if landed is not None:
                return True, landed


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
