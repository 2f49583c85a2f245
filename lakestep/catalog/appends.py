"""The fast path of the hottest commit: one table, blind (appends and key upserts).

A streaming sink commits a blind append every micro-batch, so this path is
written straight to the database driver:

* SQLite (inside the caller's ``BEGIN IMMEDIATE`` transaction): the same four
  statements as the general path (advance the head with ``UPDATE ...
  RETURNING``, record the transaction, the files and the commit), without
  SQLAlchemy's per-statement work.
* PostgreSQL: ONE statement of data-modifying CTEs, run in autocommit mode, so
  the whole commit is a single round trip: the head row update (which locks
  the row), the open epoch read ``FOR SHARE`` when the commit takes the open
  epoch, and the inserts. The statement is atomic on its own. Every insert
  depends on the head update, so a missing table inserts nothing.

Both raise the driver's integrity error when the idempotency key is taken;
the caller then returns the recorded result, as on the general path.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.engine import Connection

from ..errors import TableNotFoundError
from .commit import OPEN_EPOCH, CommitResult, KeyReplayed, TableChange

_FILE_COLS = "table_id, path, added_version, removed_version, record_count, file_size, partition, stats, source_ids, seq"


def _commit_row(c: TableChange, *, version: int, dv: int, at: float, barrier: int | None) -> CommitResult:
    return CommitResult(
        table=c.ident, version=version, data_version=dv, operation=c.operation.value, base_version=version - 1,
        added_files=len(c.added), added_rows=sum(f.record_count for f in c.added), barrier=barrier,
        committed_at=at, summary=c.summary,
    )


def sqlite_commit(conn: Connection, c: TableChange, txn: dict[str, Any]) -> CommitResult:
    """Inside the caller's BEGIN IMMEDIATE transaction."""
    cur = conn.exec_driver_sql
    if txn["job_id"] is not None:  # commit.py step 2b
        taken = cur("SELECT 1 FROM ls_txn WHERE job_id = ? AND batch_id >= ? LIMIT 1",
                    (txn["job_id"], txn["batch_id"])).fetchone()
        if taken:
            raise KeyReplayed(txn["job_id"], txn["batch_id"])
    if True:
        barrier = c.barrier
        if barrier == OPEN_EPOCH:
            barrier = cur("SELECT open_epoch FROM ls_epoch WHERE id = 1").fetchone()[0]
        now = txn["committed_at"]
        row = cur(
            "UPDATE ls_table SET version = version + 1, data_version = data_version + ?, "
            "last_commit_at = CASE WHEN last_commit_at + 1e-6 > ? THEN last_commit_at + 1e-6 ELSE ? END "
            "WHERE table_id = ? RETURNING version, data_version, last_commit_at",
            (1 if c.added else 0, now, now, c.table_id),
        ).fetchone()
        if row is None:
            raise TableNotFoundError(c.ident)
        v, dv, at = int(row[0]), int(row[1]), float(row[2])
        txn_id = cur(
            "INSERT INTO ls_txn (txn_uuid, job_id, batch_id, committed_at) VALUES (?, ?, ?, ?) RETURNING txn_id",
            (txn["txn_uuid"], txn["job_id"], txn["batch_id"], now),
        ).fetchone()[0]
        if c.added:
            cur(
                f"INSERT INTO ls_file ({_FILE_COLS}) VALUES (?, ?, ?, NULL, ?, ?, ?, ?, ?, ?)",
                [(c.table_id, f.path, v, f.record_count, f.file_size, f.partition_json, f.stats_json,
                  json.dumps(f.source_ids) if f.source_ids else None, f.seq) for f in c.added],
            )
        result = _commit_row(c, version=v, dv=dv, at=at, barrier=barrier)
        cur(
            "INSERT INTO ls_commit (table_id, version, data_version, operation, base_version, txn_id, barrier, "
            "committed_at, added_files, removed_files, added_rows, removed_rows, summary) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, 0, ?)",
            (c.table_id, v, dv, c.operation.value, v - 1, txn_id, barrier, at, len(c.added), result.added_rows,
             json.dumps(c.summary, default=str) if c.summary else "{}"),
        )
        return result


def postgres_commit(conn: Connection, c: TableChange, txn: dict[str, Any]) -> CommitResult:
    """One statement; the caller's connection is in autocommit mode."""
    params: dict[str, Any] = {
        "tid": c.table_id, "dv_inc": 1 if c.added else 0, "now": txn["committed_at"],
        "uuid": txn["txn_uuid"], "job": txn["job_id"], "batch": txn["batch_id"], "op": c.operation.value,
        "nfiles": len(c.added), "nrows": sum(f.record_count for f in c.added),
        "summary": json.dumps(c.summary, default=str) if c.summary else "{}",
    }
    ctes = []
    if c.barrier == OPEN_EPOCH:
        ctes.append("e AS (SELECT open_epoch FROM ls_epoch WHERE id = 1 FOR SHARE)")
        barrier_sql = "(SELECT open_epoch FROM e)"
    else:
        barrier_sql = "%(barrier)s::bigint"
        params["barrier"] = c.barrier
    # commit.py step 2b: no head moves when the key is at or below the job's newest batch
    replay_guard = ("" if txn["job_id"] is None else
                    " AND NOT EXISTS (SELECT 1 FROM ls_txn WHERE job_id = %(job)s AND batch_id >= %(batch)s)")
    ctes.append(
        "h AS (UPDATE ls_table SET version = version + 1, data_version = data_version + %(dv_inc)s, "
        "last_commit_at = GREATEST(last_commit_at + 1e-6, %(now)s) WHERE table_id = %(tid)s" + replay_guard +
        " RETURNING version, data_version, last_commit_at)"
    )
    ctes.append(
        "t AS (INSERT INTO ls_txn (txn_uuid, job_id, batch_id, committed_at) "
        "SELECT %(uuid)s, %(job)s, %(batch)s, %(now)s FROM h RETURNING txn_id)"
    )
    if c.added:
        values = []
        for i, f in enumerate(c.added):
            values.append(f"(%(p{i})s, %(r{i})s::bigint, %(s{i})s::bigint, %(pa{i})s, %(st{i})s, %(src{i})s, "
                          f"%(seq{i})s::bigint)")
            params.update({f"p{i}": f.path, f"r{i}": f.record_count, f"s{i}": f.file_size,
                           f"pa{i}": f.partition_json, f"st{i}": f.stats_json,
                           f"src{i}": json.dumps(f.source_ids) if f.source_ids else None, f"seq{i}": f.seq})
        ctes.append(
            f"f AS (INSERT INTO ls_file ({_FILE_COLS}) SELECT %(tid)s, v.path, h.version, NULL, v.rc, v.fs, "
            f"v.part, v.stats, v.src, v.seq FROM h, (VALUES {', '.join(values)}) AS v(path, rc, fs, part, stats, "
            f"src, seq))"
        )
    ctes.append(
        "c AS (INSERT INTO ls_commit (table_id, version, data_version, operation, base_version, txn_id, barrier, "
        "committed_at, added_files, removed_files, added_rows, removed_rows, summary) "
        f"SELECT %(tid)s, h.version, h.data_version, %(op)s, h.version - 1, t.txn_id, {barrier_sql}, "
        "h.last_commit_at, %(nfiles)s, 0, %(nrows)s, 0, %(summary)s FROM h, t RETURNING barrier)"
    )
    sql = "WITH " + ", ".join(ctes) + " SELECT h.version, h.data_version, h.last_commit_at, c.barrier FROM h, c"
    row = conn.exec_driver_sql(sql, params).fetchone()
    if row is None:
        if txn["job_id"] is not None:  # a replay, or a missing table: the caller tells which
            raise KeyReplayed(txn["job_id"], txn["batch_id"])
        raise TableNotFoundError(c.ident)
    return _commit_row(c, version=int(row[0]), dv=int(row[1]), at=float(row[2]),
                       barrier=None if row[3] is None else int(row[3]))

