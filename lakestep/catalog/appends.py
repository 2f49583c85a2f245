"""The blind append: commits that only add rows (appends and primary-key upserts).

Blind changes never conflict (commit.py step 2c has nothing to decide), so
they need no read of the table: each backend has exactly ONE implementation,
written straight to the database driver because a streaming sink commits one
every micro-batch. The backend runs it (``Backend.append`` inside a write
transaction, ``Backend.commit_blind`` for the one-table fast path):

* SQLite (:func:`sqlite_append`, inside the caller's ``BEGIN IMMEDIATE``
  transaction): per table, in table-id order, advance the head with
  ``UPDATE ... RETURNING``; then record the transaction; then, per table,
  the files and the commit row. Its statements run on the DB-API cursor
  itself (:class:`_Driver`), not through SQLAlchemy's execution layer, whose
  result set-up cost more than SQLite's own work (5 statements: ~115 us of an
  append's ~1.4 ms, against ~5 us for the same calls on the cursor; a driver
  error still reaches the caller as SQLAlchemy's exception, so the error
  translation is unchanged). One file's row takes its id from the cursor's
  ``lastrowid``; several files' from ``RETURNING``.
* PostgreSQL (:func:`postgres_append`): per table, in table-id order, ONE
  statement of data-modifying CTEs: the head row update (which locks the
  row), the open epoch read ``FOR SHARE`` when the commit takes the open
  epoch, the transaction record (with the first table), the files and the
  commit row. Every insert depends on the head update, so a missing table
  inserts nothing. The fast path runs its one statement in autocommit mode:
  the whole commit is a single round trip, atomic on its own; several tables
  run inside the caller's transaction.

Both take the idempotency key first (commit.py step 2b): a key at or below
the job's newest batch is a replay (:class:`KeyReplayed`), and a key taken
concurrently raises the driver's integrity error; the caller then returns the
recorded result, as on the general path. Commit times are forced to increase
per table, whatever the writers' clocks say.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from typing import Any, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .. import _failpoints
from ..errors import InvalidArgumentError, TableNotFoundError
from . import epoch, stats_sql
from . import schema as S
from .changes import (
    FILE_FIELDS,
    CommitResult,
    KeyReplayed,
    TableChange,
    file_row,
    file_values,
    warn_older_schema,
)
from .commit import FILE_CHUNK, ids_in_order, insert_files_sql
from .epoch import OPEN_EPOCH

_INSERT_COLS = ("table_id", *FILE_FIELDS)
_FILE_COLS = ", ".join(_INSERT_COLS)
# The values of the PostgreSQL statement's file rows, in the order of _INSERT_COLS: from
# its VALUES list ``v`` and the head update ``h``.
_PG_FILE_VALUES = ", ".join({
    "table_id": "%(tid)s", "added_version": "h.version", "removed_version": "NULL", "path": "v.path",
    "record_count": "v.rc", "file_size": "v.fs", "partition": "v.part", "stats": "v.stats",
    "source_ids": "v.src", "seq": "v.seq"}[k] for k in _INSERT_COLS)


_PATH = _INSERT_COLS.index("path")
_ONE_FILE_SQLITE = f"INSERT INTO ls_file ({_FILE_COLS}) VALUES ({', '.join('?' * len(_INSERT_COLS))})"


class _Driver:
    """Statements on the DB-API (sqlite3) cursor of ``conn``, inside its transaction: no
    SQLAlchemy result set-up, no engine events (the SQL echo does not show them). A driver
    error is raised as the SQLAlchemy exception the same statement would have raised
    through ``conn`` (``sqlalchemy.exc.IntegrityError``, ``OperationalError``, ...), so the
    backend's error translation (backend.translate) and the callers' handling see no
    difference. (SQLAlchemy's disconnect detection is not run on them: an in-process SQLite
    database has no connection to lose.)"""

    __slots__ = ("cursor", "dialect")

    def __init__(self, conn: Connection) -> None:
        self.cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        self.dialect = conn.dialect

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        try:
            return self.cursor.execute(sql, params)
        except sqlite3.Error as e:
            raise self._wrapped(sql, params, e) from e

    def _wrapped(self, sql: str, params: Any, e: sqlite3.Error) -> BaseException:
        return sa.exc.DBAPIError.instance(sql, params, e, sqlite3.Error, dialect=self.dialect)

    def insert_files(self, values: Sequence[tuple[Any, ...]]) -> list[int]:
        """commit.insert_file_rows on the cursor: one file's id is the cursor's lastrowid (one
        row inserted); several files' come from RETURNING, :data:`FILE_CHUNK` rows a statement."""
        if len(values) == 1:
            return [int(self.execute(_ONE_FILE_SQLITE, values[0]).lastrowid)]
        ids: list[int] = []
        for i in range(0, len(values), FILE_CHUNK):
            chunk = values[i:i + FILE_CHUNK]
            got = self.execute(insert_files_sql(len(chunk), "?"), [v for row in chunk for v in row]).fetchall()
            ids.extend(ids_in_order([row[_PATH] for row in chunk], got))
        return ids

    def insert_stats(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """stats_sql.insert_rows on the cursor: one multi-row statement (none without rows)."""
        for sql, params in stats_sql.insert_statements(rows):
            self.execute(sql, params)


def _result(c: TableChange, *, version: int, dv: int, at: float, barrier: int | None) -> CommitResult:
    return CommitResult(
        table=c.ident, version=version, data_version=dv, operation=c.operation.value, base_version=version - 1,
        added_files=len(c.added), added_rows=sum(f.record_count for f in c.added), barrier=barrier,
        committed_at=at, summary=c.summary,
    )


def _summary(c: TableChange) -> str:
    return json.dumps(c.summary, default=str) if c.summary else "{}"


@functools.lru_cache(maxsize=64)
def _sqlite_head_sql(k: int) -> str:
    """The head update of :func:`sqlite_append`; with ``k`` > 0 column sets of the files
    added, it also returns how many of them the table has recorded (stats_sql.known_sets_sql)."""
    known = f", {stats_sql.known_sets_sql(k)}" if k else ""
    return ("UPDATE ls_table SET version = version + 1, data_version = data_version + ?, "
            "last_commit_at = CASE WHEN last_commit_at + 1e-6 > ? THEN last_commit_at + 1e-6 ELSE ? END, "
            f"stamp = {S.STAMP_SQL['sqlite']} "
            "WHERE table_id = ? RETURNING version, data_version, last_commit_at, schema_id" + known)


def sqlite_append(conn: Connection, changes: Sequence[TableChange], txn: dict[str, Any]) -> list[CommitResult]:
    """Inside the caller's BEGIN IMMEDIATE transaction. Per table: the head update (which
    also tells whether the table has the column sets of the new files' statistics rows),
    then the files (one file's id by lastrowid, several files' by RETURNING), their
    statistics rows (one statement), the column sets only when some are missing, and the
    commit row."""
    driver = _Driver(conn)
    cur = driver.execute
    if txn["job_id"] is not None:  # commit.py step 2b
        taken = cur("SELECT 1 FROM ls_txn WHERE job_id = ? AND batch_id >= ? LIMIT 1",
                    (txn["job_id"], txn["batch_id"])).fetchone()
        if taken:
            raise KeyReplayed(txn["job_id"], txn["batch_id"])
    open_ = epoch.read_for_commit(conn) if any(c.barrier == OPEN_EPOCH for c in changes) else None
    now = txn["committed_at"]
    advanced = []
    for c in sorted(changes, key=lambda c: c.table_id):
        copied, sets = stats_sql.copies([(f.record_count, f.stats_json) for f in c.added])
        params = (1 if c.added else 0, now, now, c.table_id)
        row = cur(_sqlite_head_sql(len(sets)), (*params, c.table_id, *sets) if sets else params).fetchone()
        if row is None:
            raise TableNotFoundError(c.ident)
        missing = sets if sets and row[4] != len(sets) else None  # column sets to record
        warn_older_schema(c, int(row[3]))
        advanced.append((c, int(row[0]), int(row[1]), float(row[2]), copied, missing))
    txn_id = cur(  # txn_id is the rowid: one row inserted, its id is the cursor's lastrowid
        "INSERT INTO ls_txn (txn_uuid, job_id, batch_id, committed_at) VALUES (?, ?, ?, ?)",
        (txn["txn_uuid"], txn["job_id"], txn["batch_id"], now),
    ).lastrowid
    _failpoints.hit("commit.locked")
    results = []
    for c, v, dv, at, copied, missing in advanced:
        if c.added:
            ids = driver.insert_files([file_values(c.table_id, v, f) for f in c.added])
            driver.insert_stats(stats_sql.rows_of(c.table_id, ids, copied))
            if missing:
                stats_sql.record_sets(conn, c.table_id, missing)
        _failpoints.hit("commit.after_add")
        result = _result(c, version=v, dv=dv, at=at, barrier=c.barrier if open_ is None else epoch.stamp(c.barrier, open_))
        cur(
            "INSERT INTO ls_commit (table_id, version, data_version, operation, base_version, txn_id, barrier, "
            "committed_at, added_files, removed_files, added_rows, removed_rows, summary) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, 0, ?)",
            (c.table_id, v, dv, c.operation.value, v - 1, txn_id, result.barrier, at, len(c.added),
             result.added_rows, _summary(c)),
        )
        results.append(result)
        _failpoints.hit("commit.table_done")
    _failpoints.hit("commit.before_db_commit")
    return results


def postgres_append(conn: Connection, changes: Sequence[TableChange], txn: dict[str, Any], *,
                    autocommit: bool) -> list[CommitResult]:
    """One statement per table. ``autocommit``: the caller's connection is in autocommit
    mode and there is one change (the fast path); else inside the caller's transaction."""
    if autocommit and len(changes) != 1:
        raise InvalidArgumentError("an autocommit blind append commits one table",
                                   argument="changes", value=len(changes))
    results = []
    txn_id: int | None = None
    for c in sorted(changes, key=lambda c: c.table_id):
        result, txn_id = _postgres_one(conn, c, txn, txn_id)
        results.append(result)
        if not autocommit:
            if len(results) == 1:
                _failpoints.hit("commit.locked")
            _failpoints.hit("commit.after_add")
            _failpoints.hit("commit.table_done")
    if not autocommit:
        _failpoints.hit("commit.before_db_commit")
    return results


def _postgres_one(conn: Connection, c: TableChange, txn: dict[str, Any], txn_id: int | None
                  ) -> tuple[CommitResult, int]:
    """The statement of one table; ``txn_id`` None: it records the transaction too (the first)."""
    params: dict[str, Any] = {
        "tid": c.table_id, "dv_inc": 1 if c.added else 0, "now": txn["committed_at"],
        "uuid": txn["txn_uuid"], "job": txn["job_id"], "batch": txn["batch_id"], "op": c.operation.value,
        "nfiles": len(c.added), "nrows": sum(f.record_count for f in c.added), "summary": _summary(c),
        "txn": txn_id,
    }
    ctes = []
    if c.barrier == OPEN_EPOCH:
        ctes.append(f"e AS ({epoch.FOR_COMMIT_SQL})")
        barrier_sql = "(SELECT open_epoch FROM e)"
    else:
        barrier_sql = "%(barrier)s::bigint"
        params["barrier"] = c.barrier
    # commit.py step 2b: no head moves when the key is at or below the job's newest batch
    replay_guard = ("" if txn["job_id"] is None or txn_id is not None else
                    " AND NOT EXISTS (SELECT 1 FROM ls_txn WHERE job_id = %(job)s AND batch_id >= %(batch)s)")
    ctes.append(
        "h AS (UPDATE ls_table SET version = version + 1, data_version = data_version + %(dv_inc)s, "
        "last_commit_at = GREATEST(last_commit_at + 1e-6, %(now)s), "
        f"stamp = {S.STAMP_SQL['postgresql']} WHERE table_id = %(tid)s" + replay_guard +
        " RETURNING version, data_version, last_commit_at, schema_id)"
    )
    if txn_id is None:
        ctes.append(
            "t AS (INSERT INTO ls_txn (txn_uuid, job_id, batch_id, committed_at) "
            "SELECT %(uuid)s, %(job)s, %(batch)s, %(now)s FROM h RETURNING txn_id)"
        )
    else:
        ctes.append("t AS (SELECT %(txn)s::bigint AS txn_id)")
    if c.added:
        values = []
        for i, f in enumerate(c.added):
            row = file_row(c.table_id, 0, f)
            values.append(f"(%(p{i})s, %(r{i})s::bigint, %(s{i})s::bigint, %(pa{i})s, %(st{i})s, %(src{i})s, "
                          f"%(seq{i})s::bigint)")
            params.update({f"p{i}": row["path"], f"r{i}": row["record_count"], f"s{i}": row["file_size"],
                           f"pa{i}": row["partition"], f"st{i}": row["stats"], f"src{i}": row["source_ids"],
                           f"seq{i}": row["seq"]})
        ctes.append(
            f"f AS (INSERT INTO ls_file ({_FILE_COLS}) SELECT {_PG_FILE_VALUES} "
            f"FROM h, (VALUES {', '.join(values)}) AS v(path, rc, fs, part, stats, src, seq) RETURNING file_id, path)"
        )
        ctes.extend(_postgres_stats(c, params))
    ctes.append(
        "c AS (INSERT INTO ls_commit (table_id, version, data_version, operation, base_version, txn_id, barrier, "
        "committed_at, added_files, removed_files, added_rows, removed_rows, summary) "
        f"SELECT %(tid)s, h.version, h.data_version, %(op)s, h.version - 1, t.txn_id, {barrier_sql}, "
        "h.last_commit_at, %(nfiles)s, 0, %(nrows)s, 0, %(summary)s FROM h, t RETURNING barrier, txn_id)"
    )
    sql = ("WITH " + ", ".join(ctes) +
           " SELECT h.version, h.data_version, h.last_commit_at, c.barrier, c.txn_id, h.schema_id FROM h, c")
    head = conn.exec_driver_sql(sql, params).fetchone()
    if head is None:
        if txn["job_id"] is not None and txn_id is None:  # a replay, or a missing table: the caller tells which
            raise KeyReplayed(txn["job_id"], txn["batch_id"])
        raise TableNotFoundError(c.ident)
    warn_older_schema(c, int(head[5]))
    result = _result(c, version=int(head[0]), dv=int(head[1]), at=float(head[2]),
                     barrier=None if head[3] is None else int(head[3]))
    return result, int(head[4])


def _postgres_stats(c: TableChange, params: dict[str, Any]) -> list[str]:
    """The CTEs recording the typed statistics rows (stats_sql.py) of the files inserted by
    CTE ``f`` and their column sets, in the same statement. A path names one new file."""
    stats_values = []
    copied, sets = stats_sql.copies([(f.record_count, f.stats_json) for f in c.added])
    for i, got in enumerate(copied):
        for j, (col, nulls, lo, hi, w) in enumerate(got):
            k = f"{i}_{j}"
            # CAST, not ::bigint: the driver writes -9223372036854775808 as a literal, which
            # `::` would cast before the minus applies (out of range)
            stats_values.append(f"(%(p{i})s, %(sc{k})s, CAST(%(sn{k})s AS bigint), CAST(%(sl{k})s AS bigint), "
                                f"CAST(%(sh{k})s AS bigint), CAST(%(sw{k})s AS integer))")
            params.update({f"sc{k}": col, f"sn{k}": nulls, f"sl{k}": lo, f"sh{k}": hi, f"sw{k}": w})
    ctes = []
    if stats_values:
        ctes.append(
            "fs AS (INSERT INTO ls_file_stats (file_id, column_name, table_id, null_count, min_value, max_value, "
            f"width) SELECT f.file_id, s.col, %(tid)s, s.nulls, s.lo, s.hi, s.w FROM f JOIN (VALUES "
            f"{', '.join(stats_values)}) AS s(path, col, nulls, lo, hi, w) ON s.path = f.path)")
    set_values = []
    for i, (digest, cols) in enumerate(sets.items()):
        set_values.append(f"(%(sd{i})s, %(sj{i})s)")
        params.update({f"sd{i}": digest, f"sj{i}": cols})
    ctes.append(
        "sc AS (INSERT INTO ls_stats_columns (table_id, digest, columns) SELECT %(tid)s, d.digest, d.cols "
        f"FROM h, (VALUES {', '.join(set_values)}) AS d(digest, cols) ON CONFLICT DO NOTHING)")
    return ctes
