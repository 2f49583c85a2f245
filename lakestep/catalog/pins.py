"""What holds storage: files that cleanup keeps only because a version is pinned.

Cleanup (cleanup.py) deletes a removed file once its removal is older than the
retention window (at or before the *floor* version), unless a pin holds a
version in which the file is live: a live snapshot, a version lock, or a
retained Iceberg snapshot lakestep published (kind ``iceberg``); the rules are
retention.py's. :func:`pinned_storage` answers, per pin, which of those files
it keeps and how many bytes: what dropping the snapshot, releasing the lock,
or the publisher letting the Iceberg snapshot go would let cleanup reclaim
(a file two pins hold is counted for each; ``PinnedStorage.total_bytes``
counts it once).

Example::

    for pin in pinned_storage(table).pins:
        print(pin.kind, pin.name, pin.version, pin.files, pin.bytes)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import sqlalchemy as sa

from . import retention
from . import schema as S

if TYPE_CHECKING:
    from .table import Table


@dataclass(frozen=True)
class Pin:
    """One snapshot, version lock or published Iceberg snapshot, and the storage it keeps from
    cleanup."""

    kind: Literal["snapshot", "lock", "iceberg"]
    name: str  # the snapshot's name, the lock's locker, or ``iceberg-<Iceberg snapshot id>``
    version: int
    barrier: int | None  # a snapshot's barrier (None for locks and plain snapshots)
    expires_at: float | None
    files: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class PinnedStorage:
    table: str
    floor_version: int  # the version current at the start of the retention window (-1: none)
    pins: list[Pin] = field(default_factory=list)
    total_files: int = 0  # distinct files held by at least one pin
    total_bytes: int = 0


def pinned_storage(table: "Table", *, retention_seconds: float | None = None,
                   now: float | None = None) -> PinnedStorage:
    """The live pins of ``table`` and the expired files each keeps (module docstring)."""
    R = table.retention_seconds if retention_seconds is None else float(retention_seconds)
    now = table.catalog.clock.now() if now is None else now
    f, sn, lk, ps = S.files.c, S.snapshots.c, S.locks.c, S.published_snapshots.c
    tid = table.table_id
    with table.catalog.backend.read() as conn:
        floor = retention.floor_version(conn, tid, now, R)
        pins = [Pin("snapshot", r.name, int(r.version), r.barrier, r.expires_at) for r in conn.execute(
            sa.select(sn.name, sn.version, sn.barrier, sn.expires_at).where(
                sn.table_id == tid, retention.live(S.snapshots, now)).order_by(sn.version, sn.name))]
        pins += [Pin("lock", r.locker, int(r.version), None, r.expires_at) for r in conn.execute(
            sa.select(lk.locker, lk.version, lk.expires_at).where(
                lk.table_id == tid, retention.live(S.locks, now)).order_by(lk.version, lk.lock_id))]
        pins += [Pin("iceberg", f"iceberg-{r.snapshot_id}", int(r.version), r.barrier, None) for r in conn.execute(
            sa.select(ps.snapshot_id, ps.version, ps.barrier).where(ps.table_id == tid)
            .order_by(ps.version, ps.snapshot_id))]
        rows = conn.execute(sa.select(f.file_id, f.path, f.added_version, f.removed_version, f.file_size).where(
            f.table_id == tid, f.removed_version.is_not(None), f.removed_version <= floor)).all()
    held: dict[int, int] = {}
    out = []
    for p in pins:
        mine = [r for r in rows if r.added_version <= p.version < r.removed_version]
        for r in mine:
            held[r.file_id] = int(r.file_size)
        out.append(Pin(p.kind, p.name, p.version, None if p.barrier is None else int(p.barrier), p.expires_at,
                       len(mine), sum(int(r.file_size) for r in mine)))
    return PinnedStorage(table.ident, floor, out, len(held), sum(held.values()))
