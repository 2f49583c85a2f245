"""Reads of the coordinator's barrier snapshots (rows of ``ls_snapshot``).

**SNAPSHOT(t, e)**: a live row of ``ls_snapshot`` names a version of ``t``
with barrier ``e`` (sealing.py takes them; they expire with ``expires_at``).
"""

from __future__ import annotations

import time
from typing import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..catalog.retention import live_sql

SNAPSHOT_PREFIX = "lakestep-barrier-"

_COMMON_SNAPSHOT = sa.text(f"""
SELECT s.barrier FROM ls_snapshot s
 WHERE s.table_id = :first AND s.barrier IS NOT NULL AND {live_sql('s')}
   AND (SELECT count(DISTINCT s2.table_id) FROM ls_snapshot s2
         WHERE s2.barrier = s.barrier AND s2.table_id IN :ids
           AND {live_sql('s2')}) = :n
 ORDER BY s.barrier DESC LIMIT 1
""").bindparams(sa.bindparam("ids", expanding=True))
_SNAPSHOT_ROWS = sa.text(f"""
SELECT table_id, version, name FROM ls_snapshot
 WHERE barrier = :b AND table_id IN :ids AND {live_sql()}
 ORDER BY table_id, name
""").bindparams(sa.bindparam("ids", expanding=True))
_NEWEST_SNAPSHOT = sa.text(f"""
SELECT table_id, barrier FROM ls_snapshot
 WHERE table_id IN :ids AND barrier IS NOT NULL AND {live_sql()}
 ORDER BY barrier DESC LIMIT 1
""").bindparams(sa.bindparam("ids", expanding=True))
_OLDEST_RETAINED = sa.text(f"""
SELECT min(barrier) FROM ls_snapshot
 WHERE name LIKE '{SNAPSHOT_PREFIX}%' AND barrier IS NOT NULL AND {live_sql()}
""")


def common_snapshot(conn: Connection, ids: Sequence[int], now: float | None = None
                    ) -> tuple[int, dict[int, int]] | None:
    """The newest barrier that is a SNAPSHOT of every table, with each table's version."""
    ids = sorted(set(ids))
    if not ids:
        return None
    now = time.time() if now is None else now
    b = conn.execute(_COMMON_SNAPSHOT, {"first": ids[0], "ids": ids, "n": len(ids), "now": now}).scalar()
    if b is None:
        return None
    versions: dict[int, int] = {}
    for r in conn.execute(_SNAPSHOT_ROWS, {"b": int(b), "ids": ids, "now": now}):
        versions.setdefault(int(r[0]), int(r[1]))
    return int(b), versions


def newest_snapshot(conn: Connection, ids: Sequence[int], now: float | None = None) -> tuple[int, int] | None:
    """(table id, barrier) of the newest live snapshot carrying a barrier among ``ids``."""
    if not ids:
        return None
    now = time.time() if now is None else now
    row = conn.execute(_NEWEST_SNAPSHOT, {"ids": sorted(set(ids)), "now": now}).first()
    return None if row is None else (int(row[0]), int(row[1]))


def oldest_retained(conn: Connection, now: float | None = None) -> int | None:
    """The since-frontier: the oldest barrier the coordinator's snapshots still retain."""
    now = time.time() if now is None else now
    v = conn.execute(_OLDEST_RETAINED, {"now": now}).scalar()
    return None if v is None else int(v)
