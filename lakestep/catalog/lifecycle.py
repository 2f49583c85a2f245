"""Named snapshots and version locks: what keeps a table version readable.

* A **snapshot** names a table version (a tag), optionally with the barrier it
  stands for. It is retained until dropped or until it expires (retention by
  age), or until :func:`expire_snapshots` trims by count.
* A **version lock** ``(locker, table, version, kind, expires_at)`` pins a
  version for a reader. A leased lock lapses at ``expires_at`` unless renewed,
  so a crashed reader cannot pin files forever; a permanent lock
  (``lease_seconds=None``) lasts until released.

Cleanup never deletes a file that a retained snapshot or a live lock's
version references.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..errors import InvalidArgumentError, LockNotFoundError, SnapshotExistsError, VersionNotFoundError
from . import retention
from . import schema as S

if TYPE_CHECKING:
    from .handle import CatalogLike, TableHandle


@dataclass(frozen=True)
class Snapshot:
    table: str
    name: str
    version: int
    barrier: int | None
    created_at: float
    expires_at: float | None


def _now(catalog: "CatalogLike") -> float:
    return catalog.clock.now()


def _live_snapshot_clause(now: float) -> Any:
    return retention.live(S.snapshots, now)


def create_snapshot(
    table: "TableHandle",
    name: str,
    *,
    version: int | None = None,
    barrier: int | None = None,
    retain_seconds: float | None = None,
    exist_ok: bool = False,
) -> Snapshot:
    if not name or len(name) > 256:
        raise InvalidArgumentError("a snapshot name is 1 to 256 characters", argument="name", value=name)
    now = _now(table.catalog)
    with table.catalog.backend.write() as conn:
        v = _pinnable_version(conn, table, version, now, retained=False)
        existing = conn.execute(
            sa.select(S.snapshots).where(S.snapshots.c.table_id == table.table_id, S.snapshots.c.name == name)
        ).mappings().first()
        if existing is not None:
            if existing["expires_at"] is not None and existing["expires_at"] <= now:
                conn.execute(sa.delete(S.snapshots).where(
                    S.snapshots.c.table_id == table.table_id, S.snapshots.c.name == name))
            elif exist_ok:
                return _snapshot(table.ident, existing)
            else:
                raise SnapshotExistsError(table.ident, name)
        row = {
            "table_id": table.table_id, "name": name, "version": v, "barrier": barrier, "created_at": now,
            "expires_at": None if retain_seconds is None else now + retain_seconds,
        }
        conn.execute(sa.insert(S.snapshots).values(**row))
    return _snapshot(table.ident, row)


def _snapshot(ident: str, r: Any) -> Snapshot:
    return Snapshot(ident, r["name"], r["version"], r["barrier"], r["created_at"], r["expires_at"])


def list_snapshots(table: "TableHandle") -> list[Snapshot]:
    q = (
        sa.select(S.snapshots)
        .where(S.snapshots.c.table_id == table.table_id, _live_snapshot_clause(_now(table.catalog)))
        .order_by(S.snapshots.c.version, S.snapshots.c.name)
    )
    with table.catalog.backend.read() as conn:
        return [_snapshot(table.ident, r) for r in conn.execute(q).mappings()]


def snapshot_version(table: "TableHandle", conn: sa.Connection, name: str) -> int:
    row = conn.execute(
        sa.select(S.snapshots.c.version).where(
            S.snapshots.c.table_id == table.table_id, S.snapshots.c.name == name, _live_snapshot_clause(_now(table.catalog))
        )
    ).first()
    if row is None:
        raise VersionNotFoundError(table.ident, f"snapshot {name!r}")
    return int(row.version)


def drop_snapshot(table: "TableHandle", name: str) -> None:
    with table.catalog.backend.write() as conn:
        res = conn.execute(sa.delete(S.snapshots).where(
            S.snapshots.c.table_id == table.table_id, S.snapshots.c.name == name))
        if res.rowcount == 0:
            raise VersionNotFoundError(table.ident, f"snapshot {name!r}")


def expire_snapshots(table: "TableHandle", *, keep_last: int | None = None, older_than: float | None = None) -> int:
    """Drop expired snapshots, all but the newest ``keep_last``, and those created
    more than ``older_than`` seconds ago. Returns how many were dropped."""
    now = _now(table.catalog)
    dropped = 0
    with table.catalog.backend.write() as conn:
        c = S.snapshots.c
        dropped += conn.execute(sa.delete(S.snapshots).where(
            c.table_id == table.table_id, retention.lapsed(S.snapshots, now))).rowcount
        if older_than is not None:
            dropped += conn.execute(sa.delete(S.snapshots).where(
                c.table_id == table.table_id, c.created_at < now - older_than)).rowcount
        if keep_last is not None:
            names = [r.name for r in conn.execute(
                sa.select(c.name).where(c.table_id == table.table_id).order_by(c.version.desc(), c.created_at.desc())
            )]
            for name in names[keep_last:]:
                dropped += conn.execute(sa.delete(S.snapshots).where(
                    c.table_id == table.table_id, c.name == name)).rowcount
    return dropped


# ------------------------------------------------------------------ locks
@dataclass
class VersionLock:
    """A pin on one table version. Use as a context manager, or call :meth:`release`."""

    catalog: "CatalogLike"
    lock_id: int
    locker: str
    table: str
    table_id: int
    version: int
    kind: str
    expires_at: float | None

    def renew(self, lease_seconds: float) -> None:
        with self.catalog.backend.write() as conn:
            exp = _now(self.catalog) + lease_seconds
            res = conn.execute(sa.update(S.locks).where(
                S.locks.c.lock_id == self.lock_id,
                retention.live(S.locks, _now(self.catalog)),
            ).values(expires_at=exp))
            if res.rowcount == 0:
                raise LockNotFoundError(self.lock_id)
            self.expires_at = exp

    def release(self) -> None:
        with self.catalog.backend.write() as conn:
            conn.execute(sa.delete(S.locks).where(S.locks.c.lock_id == self.lock_id))

    def __enter__(self) -> "VersionLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def lock_version(
    table: "TableHandle",
    *,
    locker: str,
    version: int | None = None,
    kind: str = "read",
    lease_seconds: float | None = 300.0,
) -> VersionLock:
    if not locker or len(locker) > 256:
        raise InvalidArgumentError("a locker name is 1 to 256 characters", argument="locker", value=locker)
    now = _now(table.catalog)
    with table.catalog.backend.write() as conn:
        v = _pinnable_version(conn, table, version, now, retained=True)
        exp = None if lease_seconds is None else now + lease_seconds
        lock_id = conn.execute(sa.insert(S.locks).values(
            locker=locker, table_id=table.table_id, version=v, kind=kind, created_at=now, expires_at=exp,
        ).returning(S.locks.c.lock_id)).scalar_one()
    return VersionLock(table.catalog, int(lock_id), locker, table.ident, table.table_id, v, kind, exp)


def _pinnable_version(conn: sa.Connection, table: "TableHandle", version: int | None, now: float, *,
                      retained: bool) -> int:
    """``version`` (default: the newest), checked to exist; with ``retained``, also
    still guaranteed by cleanup (see :func:`_retained`)."""
    head = table.head(conn)[0]
    v = head if version is None else int(version)
    if not 0 <= v <= head:
        raise VersionNotFoundError(table.ident, f"version {v} (newest is {head})")
    if retained and v < head and not _retained(conn, table, v, now):
        raise VersionNotFoundError(table.ident, f"version {v} in the retention window any more: it cannot be pinned")
    return v


def _retained(conn: sa.Connection, table: "TableHandle", v: int, now: float) -> bool:
    """A version still guaranteed readable: current after the window's start, or snapshotted.

    Cleanup keeps exactly these (cleanup.py), so a lock taken on one is safe."""
    c = S.commits.c
    nxt = conn.execute(sa.select(c.committed_at).where(c.table_id == table.table_id, c.version == v + 1)).scalar()
    if nxt is not None and nxt > now - table.retention_seconds:
        exists = conn.execute(sa.select(c.version).where(c.table_id == table.table_id, c.version == v)).first()
        return exists is not None
    snap = conn.execute(sa.select(S.snapshots.c.name).where(
        S.snapshots.c.table_id == table.table_id, S.snapshots.c.version == v, _live_snapshot_clause(now))).first()
    return snap is not None


def live_locks(catalog: "CatalogLike",
               table_id: int | None = None) -> list[tuple[int, str, int, int, str, float | None]]:
    """(lock_id, locker, table_id, version, kind, expires_at) of the locks in force."""
    q = sa.select(S.locks.c.lock_id, S.locks.c.locker, S.locks.c.table_id, S.locks.c.version, S.locks.c.kind,
                  S.locks.c.expires_at).where(
        retention.live(S.locks, _now(catalog)))
    if table_id is not None:
        q = q.where(S.locks.c.table_id == table_id)
    with catalog.backend.read() as conn:
        return [tuple(r) for r in conn.execute(q.order_by(S.locks.c.lock_id))]


def release_locks(catalog: "CatalogLike", locker: str) -> int:
    with catalog.backend.write() as conn:
        return conn.execute(sa.delete(S.locks).where(S.locks.c.locker == locker)).rowcount
