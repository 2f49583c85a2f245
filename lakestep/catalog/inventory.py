"""What the catalog holds, summed: live files and bytes per table, each job's newest committed
batch. Bounded statements whatever the number of tables and jobs (one each): ``lakestep
serve``'s metrics and the operator's figures read them.

Not guaranteed: each is one statement; read several inside one ``backend.read()`` for one
consistent snapshot of them.
"""

from __future__ import annotations

import sqlalchemy as sa

from . import schema as S


def live_storage(conn: sa.Connection) -> dict[int, tuple[int, int]]:
    """table id -> (live files, their bytes) at each table's head; tables with none are absent."""
    f = S.files.c
    return {int(r[0]): (int(r[1]), int(r[2] or 0)) for r in conn.execute(
        sa.select(f.table_id, sa.func.count(), sa.func.sum(f.file_size)).where(
            f.removed_version.is_(None)).group_by(f.table_id))}


def newest_batches(conn: sa.Connection) -> dict[str, tuple[int | None, float]]:
    """job id -> (its newest committed batch id, or None when it commits without batch ids;
    the time of its newest commit), from the idempotency records (``ls_txn``)."""
    x = S.txns.c
    return {str(r[0]): (None if r[1] is None else int(r[1]), float(r[2])) for r in conn.execute(
        sa.select(x.job_id, sa.func.max(x.batch_id), sa.func.max(x.committed_at)).where(
            x.job_id.is_not(None)).group_by(x.job_id))}
