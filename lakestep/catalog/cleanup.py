"""Cleanup: reclaiming storage without breaking any reader or writer (TTL: maintenance.apply_ttl).

Which versions are *retained* at time ``now`` with retention window ``R``
(the rules are retention.py's, which every reader of them shares):

* every version committed after ``now - R`` and the version that was current
  at ``now - R`` (``floor``): time travel within the window always works;
* every version named by a snapshot that has not expired;
* every version pinned by a version lock in force;
* every version an Iceberg snapshot published from the table still shows
  (``ls_published_snapshot``, lakestep/iceberg): the publisher deletes that
  row only after the snapshot left the Iceberg metadata.

A data file (a row of ``ls_file``) is live in versions ``[added, removed)``.
It *expires* when it was removed at or before ``floor`` and no pinned version
falls in its range. Cleanup, in order:

1. reads, in one snapshot, the floor, the pinned versions and the expired files;
2. deletes the bytes of every expired path that no other file row still uses
   (a compaction undo may have re-added the same path);
3. deletes files under the table's ``data/`` directory that no file row names
   and that are older than ``R`` and than :data:`IN_FLIGHT_FLOOR_SECONDS`
   (orphans of writers that never committed), except those inside another
   table's location or resolving outside ``data/`` through a symlink
   (``locations.py`` step 2);
4. prunes metadata: expired file rows, commit rows below the floor that no
   snapshot or lock pins (except the table's newest commit that carries a
   barrier: the barrier layer reads a table's progress from it), lapsed locks
   and expired snapshots, and idempotency records older than ``R`` whose
   commits are gone, except each job's newest (exactly once has no window).

Why concurrent work is safe: a file removed at or before the floor was removed
by a commit older than ``R``; a DELETE/UPDATE only undoes (re-adds the inputs
of) compactions younger than ``R`` (commit.py), so no later commit can bring an
expired path back; a reader that starts now reads a retained version, and one
that reads longer than ``R`` must hold a version lock. A file a writer has
written but not committed yet (a transaction's, a Spark micro-batch's) looks
exactly like an orphan; step 3 never takes one younger than
:data:`IN_FLIGHT_FLOOR_SECONDS`, whatever ``R`` says (even 0), and writers
commit their files within that floor of writing them.

Step 3 is the only one that lists storage: one recursive listing of ``data/``
per run (on an object store, the store's paged listing of that prefix); the
other steps delete paths the catalog names. On object stores a file's age
is read from its LastModified time, which S3 gives in whole seconds: there a
file counts one second younger than its LastModified says.

Not guaranteed: with several machines, clocks (the object store's included)
must agree to well within ``R``. An S3 multipart upload's LastModified is when
the upload began: a writer must commit within :data:`IN_FLIGHT_FLOOR_SECONDS`
of starting a file's upload, not of finishing it.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs
import sqlalchemy as sa

from . import retention as retention_rules
from . import schema as S

if TYPE_CHECKING:
    from .handle import TableHandle

log = logging.getLogger(__name__)

#: An orphan younger than this is never deleted, whatever the retention window:
#: it may belong to a commit in flight (module docstring, step 3).
IN_FLIGHT_FLOOR_SECONDS = 3600.0


@dataclass
class CleanupReport:
    table: str
    dry_run: bool
    floor_version: int
    pinned_versions: list[int]
    deleted_files: list[str] = field(default_factory=list)
    deleted_bytes: int = 0
    orphan_files: list[str] = field(default_factory=list)
    orphan_bytes: int = 0
    pruned_file_rows: int = 0
    pruned_commit_rows: int = 0

    def __str__(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        return (
            f"{self.table}: {verb} {len(self.deleted_files)} expired file(s), {self.deleted_bytes} bytes, and "
            f"{len(self.orphan_files)} orphan(s), {self.orphan_bytes} bytes; pruned {self.pruned_file_rows} file "
            f"row(s) and {self.pruned_commit_rows} commit row(s) (floor version {self.floor_version}, pinned "
            f"{self.pinned_versions})"
        )


def expired_rows(rows: Sequence[Any], pinned: Sequence[int]) -> list[Any]:
    """Step 1's rule: the file rows (``added_version``, ``removed_version``, removed at or
    before the floor) that no pinned version falls in."""
    return [r for r in rows if not any(r.added_version <= p < r.removed_version for p in pinned)]


def expired_paths(expired: Sequence[Any], others: Iterable[tuple[int, str]]) -> dict[str, int]:
    """Step 2's paths: path -> size of each expired row's path that no other row of the
    table still uses (``others``: (file id, path) of any superset of the rows sharing a path)."""
    ids = {int(r.file_id) for r in expired}
    paths = {r.path for r in expired}
    still_used = {path for fid, path in others if path in paths and fid not in ids}
    return {r.path: int(r.file_size) for r in expired if r.path not in still_used}


def reclaimable(conn: sa.Connection, retention: Mapping[int, float], now: float) -> dict[int, tuple[int, int]]:
    """What a cleanup dry run at ``now`` would find expired, per table: (files, bytes), for
    the tables of ``retention`` (table id -> retention seconds), by the rules of
    :func:`cleanup` steps 1-2. At most four statements for any number of tables
    (``lakestep serve``'s metrics): the removed file rows at or below each table's floor,
    every other row sharing a path with one of them, the pinned versions. Tables with
    nothing expired are left out."""
    if not retention:
        return {}
    f, o = S.files.alias("f"), S.files.alias("o")
    fl = retention_rules.floor_subquery(retention, now)
    gone = sa.and_(f.c.removed_version.is_not(None), f.c.removed_version <= fl.c.floor)
    rows = conn.execute(sa.select(f.c.table_id, f.c.file_id, f.c.path, f.c.added_version, f.c.removed_version,
                                  f.c.file_size).join(fl, fl.c.table_id == f.c.table_id).where(gone)).all()
    rows = [r for r in rows if int(r.table_id) in retention]
    if not rows:
        return {}
    # rows sharing a path with a removed row at or below the floor (a compaction undo re-added it)
    shared = conn.execute(sa.select(o.c.table_id, o.c.file_id, o.c.path).select_from(
        f.join(fl, fl.c.table_id == f.c.table_id).join(
            o, sa.and_(o.c.table_id == f.c.table_id, o.c.path == f.c.path, o.c.file_id != f.c.file_id))).where(
        gone)).all()
    pins = retention_rules.all_pinned_versions(conn, now)
    by_table: dict[int, list[Any]] = {}
    for r in rows:
        by_table.setdefault(int(r.table_id), []).append(r)
    others: dict[int, list[tuple[int, str]]] = {}
    for s in shared:
        others.setdefault(int(s.table_id), []).append((int(s.file_id), s.path))
    out: dict[int, tuple[int, int]] = {}
    for tid, rs in by_table.items():
        sizes = expired_paths(expired_rows(rs, pins.get(tid, [])), others.get(tid, ()))
        if sizes:
            out[tid] = (len(sizes), sum(sizes.values()))
    return out


def cleanup(
    table: "TableHandle",
    *,
    retention_seconds: float | None = None,
    dry_run: bool = False,
    orphans: bool = True,
    prune_metadata: bool = True,
    now: float | None = None,
) -> CleanupReport:
    """Delete what no retained version needs (see the module docstring)."""
    R = table.retention_seconds if retention_seconds is None else float(retention_seconds)
    now = table.catalog.clock.now() if now is None else now
    cutoff = now - R
    f = S.files.c
    tid = table.table_id
    # 1. one consistent read
    with table.catalog.backend.read() as conn:
        floor = retention_rules.floor_version(conn, tid, now, R)
        pinned = retention_rules.pinned_versions(conn, tid, now)
        rows = conn.execute(sa.select(f.file_id, f.path, f.added_version, f.removed_version, f.file_size).where(
            f.table_id == tid, f.removed_version.is_not(None), f.removed_version <= floor)).all()
        expired = expired_rows(rows, pinned)
        others: list[tuple[int, str]] = []
        if expired:
            others = [(int(r.file_id), r.path) for r in conn.execute(sa.select(f.file_id, f.path).where(f.table_id == tid))]
    report = CleanupReport(table.ident, dry_run, floor, pinned)
    sizes = expired_paths(expired, others)
    # 2. bytes of expired files
    writer = table.writer
    for path, size in sorted(sizes.items()):
        report.deleted_files.append(path)
        report.deleted_bytes += size
        if not dry_run:
            writer.delete(path)
    # 3. orphans
    if orphans:
        _orphans(table, report, min(cutoff, now - IN_FLIGHT_FLOOR_SECONDS), dry_run)
    # 4. metadata
    if prune_metadata and not dry_run:
        _prune(table, report, floor, pinned, [r.file_id for r in expired], cutoff, now)
    log.info("cleanup %s", report)
    return report


def _orphans(table: "TableHandle", report: CleanupReport, cutoff: float, dry_run: bool) -> None:
    writer = table.writer
    base = writer.full_path("data")
    try:
        infos = writer.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except (FileNotFoundError, OSError):
        return
    files = [i for i in infos if i.type == pafs.FileType.File]
    if not files:
        return
    with table.catalog.backend.read() as conn:  # after listing: a file committed meanwhile is known here
        known = set(conn.execute(sa.select(S.files.c.path).where(S.files.c.table_id == table.table_id)).scalars())
    guard = table.catalog.deletion_guard(table)
    root = writer.full_path("")
    for info in files:
        rel = info.path[len(root):].lstrip("/") if info.path.startswith(root) else info.path
        mtime = info.mtime.timestamp() if isinstance(info.mtime, dt.datetime) else 0.0
        if rel in known or mtime + writer.mtime_slack > cutoff or not guard.allows_orphan(info.path):
            continue
        report.orphan_files.append(rel)
        report.orphan_bytes += info.size or 0
        if not dry_run:
            writer.delete(rel)


def _prune(table: "TableHandle", report: CleanupReport, floor: int, pinned: list[int], expired_ids: list[int],
           cutoff: float, now: float) -> None:
    f, c, t = S.files.c, S.commits.c, S.txns.c
    tid = table.table_id
    with table.catalog.backend.write() as conn:
        for i in range(0, len(expired_ids), 500):
            conn.execute(sa.delete(S.file_stats).where(S.file_stats.c.file_id.in_(expired_ids[i:i + 500])))
            report.pruned_file_rows += conn.execute(
                sa.delete(S.files).where(f.file_id.in_(expired_ids[i:i + 500]))).rowcount
        if floor > 0:
            cond = [c.table_id == tid, c.version < floor]
            if pinned:
                cond.append(c.version.not_in(pinned))
            # The newest commit that carries a barrier is what the barrier layer
            # knows the table's progress by (an idle derived table's frontier).
            tagged = conn.execute(sa.select(sa.func.max(c.version)).where(
                c.table_id == tid, c.barrier.is_not(None))).scalar()
            if tagged is not None:
                cond.append(c.version != tagged)
            report.pruned_commit_rows = conn.execute(sa.delete(S.commits).where(*cond)).rowcount
            if report.pruned_commit_rows:  # the barrier facts (a RESTORE's version) may change
                conn.execute(sa.update(S.tables).where(S.tables.c.table_id == tid).values(stamp=S.NextStamp()))
        conn.execute(sa.delete(S.locks).where(retention_rules.lapsed(S.locks, now)))
        conn.execute(sa.delete(S.snapshots).where(
            S.snapshots.c.table_id == tid, retention_rules.lapsed(S.snapshots, now)))
        # Idempotency records outlive their commits by the retention window, and each
        # job's newest one lives as long as the catalog: a replay of any batch at or
        # below it is recognised (commit.py step 2b), however long the job was down.
        orphan_txn = ~sa.exists().where(c.txn_id == t.txn_id)
        newer = S.txns.alias("newer")
        superseded = sa.exists().where(newer.c.job_id == t.job_id, newer.c.batch_id > t.batch_id)
        conn.execute(sa.delete(S.txns).where(t.committed_at < cutoff, orphan_txn,
                                             sa.or_(t.job_id.is_(None), superseded)))
