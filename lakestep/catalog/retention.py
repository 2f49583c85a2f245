"""Retention: which versions of a table cleanup must keep readable, defined once.

At time ``now``, with a table's retention window ``R`` (seconds):

1. A snapshot or version lock is *live* when it has no expiry or expires after
   ``now`` (:func:`live`); it has *lapsed* otherwise (:func:`lapsed`), and
   cleanup may drop its row.
2. The *pinned* versions of a table (:func:`pins`, :func:`pinned_versions`,
   :func:`all_pinned_versions`) are those named by a live snapshot, a live
   version lock, or a retained Iceberg snapshot lakestep published
   (``ls_published_snapshot``: an engine reading a tag or main through Iceberg's
   metadata must find every file it names; the publisher deletes that row only
   after the snapshot left the metadata).
3. The *floor* (:func:`floor_version`, :func:`floors`) is the newest version
   committed at or before ``now - R``: the version that was current when the
   window began (-1 when there is none). Every version after it is retained.

Cleanup (cleanup.py), the operator's view of pinned storage (pins.py), the
conflict resolver's check of a restore (resolver.py), the Iceberg publisher's
tag retention and ``lakestep serve``'s metrics (through
``cleanup.reclaimable``) all read these; none writes its own copy.

Not guaranteed: ``now`` is the caller's clock (the catalog's); with several
machines, clocks must agree to well within ``R`` (cleanup.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from . import properties as P
from . import schema as S

#: Rows per ``IN (...)`` list (SQLite's bound-parameter limit is far above it).
_CHUNK = 500


def live(table: sa.Table, now: float) -> sa.ColumnElement[bool]:
    """Step 1: the rows of ``table`` (snapshots or locks) that pin at ``now``."""
    c = table.c
    return sa.or_(c.expires_at.is_(None), c.expires_at > now)


def lapsed(table: sa.Table, now: float) -> sa.ColumnElement[bool]:
    """Step 1's complement: the rows of ``table`` that no longer pin at ``now``."""
    c = table.c
    return sa.and_(c.expires_at.is_not(None), c.expires_at <= now)


def live_sql(alias: str = "") -> str:
    """Step 1 as SQL text for hand-written statements (barrier/snapshots.py): the live rows of
    ``ls_snapshot`` or ``ls_lock`` (``alias``: the table's alias in the statement), with
    ``now`` bound as ``:now``."""
    col = f"{alias}.expires_at" if alias else "expires_at"
    return f"({col} IS NULL OR {col} > :now)"


def pins(now: float, table_id: int | None = None) -> sa.CompoundSelect:
    """Step 2 as one statement: ``(table_id, version)`` of every pin of one table or of all."""

    def one(t: sa.Table, expiring: bool) -> sa.Select[Any]:
        q = sa.select(t.c.table_id, t.c.version)
        if expiring:
            q = q.where(live(t, now))
        return q if table_id is None else q.where(t.c.table_id == table_id)

    return sa.union(one(S.snapshots, True), one(S.locks, True), one(S.published_snapshots, False))


def pinned_versions(conn: sa.Connection, table_id: int, now: float) -> list[int]:
    """Step 2 of one table, ascending."""
    return sorted({int(v) for _, v in conn.execute(pins(now, table_id))})


def all_pinned_versions(conn: sa.Connection, now: float) -> dict[int, list[int]]:
    """Step 2 of every table with a pin (table id -> versions ascending), in one statement."""
    out: dict[int, list[int]] = {}
    for tid, v in conn.execute(pins(now)):
        out.setdefault(int(tid), []).append(int(v))
    return {k: sorted(v) for k, v in out.items()}


def floor_version(conn: sa.Connection, table_id: int, now: float, retention_seconds: float) -> int:
    """Step 3 of one table."""
    c = S.commits.c
    v = conn.execute(sa.select(sa.func.max(c.version)).where(
        c.table_id == table_id, c.committed_at <= now - retention_seconds)).scalar()
    return -1 if v is None else int(v)


def floor_subquery(retention: Mapping[int, float], now: float) -> sa.Subquery:
    """Step 3 of many tables as a subquery ``fl(table_id, floor)`` (tables with no version
    at or before their window's start are absent). ``retention``: table id -> window; the
    most common window is the default, the others a ``CASE`` on the table id."""
    c = S.commits.c
    values = list(retention.values())
    default = max(set(values), key=values.count) if values else 0.0
    own = {tid: now - r for tid, r in retention.items() if r != default}
    cutoff = sa.case(own, value=c.table_id, else_=now - default) if own else sa.literal(now - default)
    return sa.select(c.table_id.label("table_id"), sa.func.max(c.version).label("floor")).where(
        c.committed_at <= cutoff).group_by(c.table_id).subquery("fl")


def floors(conn: sa.Connection, retention: Mapping[int, float], now: float) -> dict[int, int]:
    """Step 3 of the tables of ``retention`` (table id -> window): table id -> floor (-1:
    none); one statement per distinct window and :data:`_CHUNK` tables."""
    c = S.commits.c
    by_window: dict[float, list[int]] = {}
    for tid, window in retention.items():
        by_window.setdefault(float(window), []).append(int(tid))
    out = {int(tid): -1 for tid in retention}
    for window, ids in by_window.items():
        for i in range(0, len(ids), _CHUNK):
            out.update({int(t): int(v) for t, v in conn.execute(
                sa.select(c.table_id, sa.func.max(c.version)).where(
                    c.table_id.in_(ids[i:i + _CHUNK]), c.committed_at <= now - window).group_by(c.table_id))})
    return out


def windows(conn: sa.Connection, *, warned: set[Any] | None = None) -> dict[int, float]:
    """Every table's retention window ``R`` (table id -> seconds; the ``lakestep.retention-seconds``
    property, its default when unset or invalid: properties.py), in one statement. ``warned``:
    the invalid values already logged (keep one set per process to log each once)."""
    t = S.tables.c
    out: dict[int, float] = {}
    for tid, ns, name, props in conn.execute(sa.select(t.table_id, t.namespace, t.name, t.properties)):
        try:
            parsed = json.loads(props or "{}")
        except ValueError:
            parsed = {}
        out[int(tid)] = float(P.value(f"{ns}.{name}", parsed, P.RETENTION, warned=warned))
    return out
